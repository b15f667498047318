"""User-facing errors: the CLI prints them as one line and exits with status 2."""


class GlmcError(Exception):
    """A mistake in the user's input (bad path, wrong shapes, unsupported model).

    The message must name the file, tensor and shape involved; the CLI prints it without a
    traceback.
    """
