# Every run of the study, in order; raw output beside this script. From the repository root.
set -e
M=${M:-$HOME/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf}
D=bench/results/2026-12-07-reround
R="env PYTHONPATH=backend:bench .venv/bin/python $D/reround.py"
for mode in out-rtn+layers-rtn out-rtn layers-rtn out-q5 out-q5+layers-rtn; do $R kl "$M" $mode; done 2>/dev/null | tee $D/kl.txt
for damp in 0.01 0.1 1.0; do $R kl "$M" out-gptq $damp; done 2>/dev/null | tee -a $D/kl.txt
$R rows "$M" 2>/dev/null | tee $D/rows.txt
$R rows "$M" layers 2>/dev/null | tee $D/rows-with-layers.txt
for i in 1 2 3; do $R speed "$M" 400; done 2>/dev/null | tee $D/speed.txt
for damp in 1.0 0.1; do $R kl "$M" all-gptq $damp; done 2>/dev/null | tee $D/kl-all-gptq.txt
mkdir -p /tmp/reround-cache/lite && $R seed "$M" 1.0 /tmp/reround-cache/lite 2>/dev/null | tee $D/seed.txt
env PYTHONPATH=backend:bench .venv/bin/python $D/versus.py "$M" /tmp/reround-cache/lite 5 2>/dev/null | tee $D/versus.txt
for damp in 1.0; do BLOCK_DIAGONAL=1 $R kl "$M" all-gptq $damp; done 2>/dev/null | tee $D/kl-all-gptq-block-diagonal.txt
for text in gsm8k code; do $R texts "$M" /tmp/reround-cache/lite $text; done 2>/dev/null | tee $D/texts.txt
