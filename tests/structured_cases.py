"""What the structured-output tests on the embedded model and on Qwen2.5 (test_structured_e2e.py,
e2e/test_qwen_structured.py) ask alike: the server's settings, a quiz schema with bounded strings (so a whole answer
fits its length), and a calculator tool."""

SETTINGS = {"TYPEWRITER_MAX_ACTIVE": "8", "TYPEWRITER_MAX_QUEUE": "32", "TYPEWRITER_MAX_CONTEXT": "1024",
            "TYPEWRITER_CHATS_PER_MINUTE": "10000", "TYPEWRITER_MAX_NEW_TOKENS_CAP": "512"}
QUESTION = [{"role": "user", "content": "Write one multiple-choice question about photosynthesis."}]
QUIZ = {"type": "object", "additionalProperties": False, "required": ["question", "choices", "answer"],
        "properties": {"question": {"type": "string", "maxLength": 100},
                       "choices": {"type": "array", "minItems": 2, "maxItems": 4,
                                   "items": {"type": "string", "maxLength": 30}},
                       "answer": {"type": "integer", "minimum": 0, "maximum": 3}}}
QUIZ_FORMAT = {"type": "json_schema", "json_schema": {"name": "quiz", "schema": QUIZ, "strict": True}}
RUNS = 100
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["expression"],
                   "properties": {"expression": {"type": "string", "pattern": "^[0-9+*/() -]{1,40}$"}}}}}


def sampled_quizzes(client, workers: int) -> list[tuple[str, str]]:
    """RUNS quiz answers under QUIZ_FORMAT, each sampled with its own seed: (text, finish_reason) each."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(seed: int) -> tuple[str, str]:
        answer = client.chat.completions.create(model="m", messages=QUESTION, response_format=QUIZ_FORMAT,
                                                temperature=0.8, seed=seed, max_tokens=400).choices[0]
        return answer.message.content, answer.finish_reason

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(ask, range(RUNS)))


# Qwen2.5's way of offering tools, cut down: what matters is that the template takes `tools` and says <tool_call>.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call tools.\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools>\nReply with <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
