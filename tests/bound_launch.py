"""A stand-in for ``_launcher.BoundLaunch`` under the interpreter, where no compiled kernel can be
bound: the tests of call sites that make bound launches (decode's plan, the three-launch backward)
run their shared-check paths on the CPU with it."""


class InterpretedLaunch:
    """``launch_ready`` calls ``run(tensors)`` (the test's launch of the kernel on new tensors with
    the bound call's other arguments) unless ``name`` is in ``declines``, where it declines,
    launching nothing, as a tensor not 16-byte aligned does. ``log`` (optional) gets
    ("ready", name) per check and (name, launched) per ``launch_ready``."""
    device, knobs = 0, ()

    def __init__(self, name, run, log=None, declines=()):
        self.name, self.run, self.log, self.declines = name, run, log, declines

    def ready(self):
        if self.log is not None:
            self.log.append(("ready", self.name))
        return True

    def same_checks(self, other):
        return other.device == self.device and other.knobs == self.knobs

    def stream(self):
        return 0

    def launch_ready(self, stream, tensors):
        launched = self.name not in self.declines
        if self.log is not None:
            self.log.append((self.name, launched))
        if launched:
            self.run(tensors)
        return launched

    def __call__(self, *tensors):
        return self.ready() and self.launch_ready(self.stream(), tensors)
