#!/usr/bin/env bash
# Fresh machine -> BERT masked-LM shards from the bundled sample corpus, then a look at them.
# --sentence-split: WikiText holds a paragraph per line (read as one sentence each, most pairs
# would be random-next).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh core
.venv/bin/mlm-pipeline prepare sample/sample_text.txt sample/wikitext2-train-1MB.txt sample/wikiextractor-AA.txt \
  --tokenizer sample/bert-base-uncased-vocab.txt --output ./out --sentence-split "$@"
.venv/bin/mlm-pipeline inspect ./out -n 3
