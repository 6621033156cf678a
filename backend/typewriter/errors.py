"""Named errors. Every error a user can cause carries a protocol code and a sentence they can act on."""


class TypewriterError(Exception):
    code = "internal"


class InvalidRequest(TypewriterError):
    """A request or sampling parameter is missing, of the wrong type or out of range."""

    code = "invalid_request"

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.problem = field, message


class PromptTooLong(TypewriterError):
    code = "prompt_too_long"

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context: int, asked: bool = True,
                 at_least: bool = False):
        """`at_least`: `prompt_tokens` is a lower bound, the prompt was not encoded whole (it was that long)."""
        size = f"at least {prompt_tokens}" if at_least else f"{prompt_tokens}"
        if asked:
            message = (f"the prompt is {size} tokens and max_new_tokens is {max_new_tokens}, but the "
                       f"model's context holds {context} tokens; shorten the conversation or ask for fewer tokens")
        else:
            message = (f"the prompt is {size} tokens, which leaves room for {max(0, context - prompt_tokens)}"
                       f" tokens of answer in the model's context of {context}, and an answer needs at least "
                       f"{max_new_tokens}; shorten the conversation")
        super().__init__(message)
        self.prompt_tokens, self.max_new_tokens, self.context = prompt_tokens, max_new_tokens, context


class Overloaded(TypewriterError):
    code = "overloaded"

    def __init__(self, queue_limit: int):
        super().__init__(f"the server's wait queue is full ({queue_limit} waiting); try again in a moment")


class EngineStopped(TypewriterError):
    code = "internal"


class ModelFormatError(TypewriterError):
    """A model file or directory cannot be loaded: unsupported architecture, quantization type or a shape mismatch."""

    code = "model_format"


class ExportError(TypewriterError):
    """`typewriter export` cannot write where it was asked to."""

    code = "export"
