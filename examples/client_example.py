"""Stream an answer from a Typewriter server with the async client, then ask a follow-up.

    typewriter serve &                     # or: make run
    python examples/client_example.py "What is a prime number?"

TYPEWRITER_URL (default http://127.0.0.1:8000) and TYPEWRITER_API_KEY say where the server is and its key.
"""

import asyncio
import os
import sys

from typewriter.client import AsyncClient, ChatError, Retry


async def main(question: str) -> None:
    url = os.environ.get("TYPEWRITER_URL", "http://127.0.0.1:8000")
    async with AsyncClient(url, api_key=os.environ.get("TYPEWRITER_API_KEY"), retry=Retry(attempts=5)) as client:
        talk = client.conversation()
        for text in (question, "Can you give me an example?"):
            print(f"> {text}")
            chat = talk.say(text)
            try:
                async for delta in chat:
                    print(delta, end="", flush=True)
            except ChatError as e:  # e.code: overloaded (after the retries), prompt_too_long, rate_limited, ...
                sys.exit(f"\nrefused: {e}")
            result = await chat.result()
            print(f"\n[{result.reason}, {result.usage.completion_tokens} tokens, "
                  f"{result.timings.tokens_per_s:.0f} tokens/s]\n")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is a prime number?"))
