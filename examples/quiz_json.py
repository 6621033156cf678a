"""The tutor writes a quiz as JSON that validates against its schema: the server's engine keeps every token
within the schema (`response_format` json_schema), so an answer that ends by itself (finish_reason "stop") always
parses; one cut at max_tokens ("length") is incomplete.

    typewriter serve &                     # or: make run
    python examples/quiz_json.py "photosynthesis"

TYPEWRITER_URL (default http://127.0.0.1:8000) and TYPEWRITER_API_KEY say where the server is and its key.
"""

import json
import os
import sys

import jsonschema
from openai import OpenAI

QUIZ = {
    "type": "object", "additionalProperties": False, "required": ["topic", "questions"],
    "properties": {
        "topic": {"type": "string", "maxLength": 60},
        "questions": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["question", "choices", "answer"],
            "properties": {
                "question": {"type": "string", "maxLength": 100},
                "choices": {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "string", "maxLength": 30}},
                "answer": {"type": "integer", "minimum": 0, "maximum": 2, "description": "index of the right choice"},
            }}},
    },
}


def main(topic: str) -> None:
    url = os.environ.get("TYPEWRITER_URL", "http://127.0.0.1:8000")
    client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("TYPEWRITER_API_KEY") or "unused")
    answer = client.chat.completions.create(
        model="tutor", max_tokens=500, temperature=0.3,
        messages=[{"role": "user", "content": f"Write a short multiple-choice quiz about {topic}."}],
        response_format={"type": "json_schema", "json_schema": {"name": "quiz", "schema": QUIZ, "strict": True}})
    if answer.choices[0].finish_reason == "length":  # every string at its longest does not fit in max_tokens
        sys.exit("the quiz ran out of room before it was complete; ask again")
    quiz = json.loads(answer.choices[0].message.content)
    jsonschema.validate(quiz, QUIZ)  # never raises for an answer that ended with "stop"
    print(f"Quiz: {quiz['topic']}")
    for n, q in enumerate(quiz["questions"], start=1):
        print(f"{n}. {q['question']}")
        for letter, choice in zip("abc", q["choices"]):
            print(f"   {letter}) {choice}")
    print("answers:", ", ".join("abc"[q["answer"]] for q in quiz["questions"]))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "photosynthesis")
