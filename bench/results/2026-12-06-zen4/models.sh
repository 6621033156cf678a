# Sourced by this study's scripts: where their results go, the Python that runs them, and the three models' files.
out=${OUT:-bench/results/2026-12-06-zen4}  # OUT: a later study's folder, for the same commands
py=${PYTHON:-.venv/bin/python}
embedded=$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")
qwen05="$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf"
qwen15="$HOME/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf"
