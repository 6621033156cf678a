#!/bin/sh
# What the server's process imports before its model loads, by top-level package (self time, ms), and the typewriter
# modules that take longest themselves: python -X importtime over the modules `typewriter serve` imports.
py=${PYTHON:-.venv/bin/python}
PYTHONPATH=backend $py -X importtime -c "import typewriter.cli, uvicorn, typewriter.server.app, typewriter.assemble, typewriter.runners.lite.start, typewriter.server.main, typewriter.commands.serve" 2>/tmp/importtime.txt
awk -F'|' '/import time:/ && $1 !~ /self/ {split($1,a,":"); name=$3; gsub(/^ +/,"",name); split(name,p,"."); s[p[1]]+=a[2]} END {for (k in s) printf "%.1f %s\n", s[k]/1000, k}' /tmp/importtime.txt | sort -n -r | head -12
echo "typewriter modules: $(grep -c ' typewriter' /tmp/importtime.txt); the longest:"
awk -F'|' '/typewriter/ {split($1,a,":"); name=$3; gsub(/^ +/,"",name); printf "%.1f %s\n", a[2]/1000, name}' /tmp/importtime.txt | sort -n -r | head -8
echo "dataclasses in typewriter: $(grep -rh '@dataclass' backend/typewriter | wc -l)"
