"""User-facing errors (the CLI prints them as one line and exits with status 2) and notes."""


class GlmcError(Exception):
    """A mistake in the user's input (bad path, wrong shapes, unsupported model).

    The message must name the file, tensor and shape involved; the CLI prints it without a
    traceback.
    """


class Note(str):
    """A line of a report's warnings that informs rather than warns (something that cannot
    be checked, not something wrong): the CLI prints it as ``note:``; JSON keeps it among the
    warnings, as text."""


def reason(error: BaseException) -> str:
    """Why a library failed on a user's file, in one line: the exception's type and the first
    sentence of its message (torch.load's run to a dozen lines of advice; for weights-only
    loading the reason comes last)."""
    text = str(error)
    _, found, unpickler = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (unpickler if found else text).splitlines()]
    first = next((line for line in lines if line), "")
    if len(first) > 160 and ". " in first:
        first = first.split(". ", 1)[0] + "."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
