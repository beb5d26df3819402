"""The one error type of bad media: the HTTP layer answers 400 with its message."""


class MediaError(ValueError):
    pass
