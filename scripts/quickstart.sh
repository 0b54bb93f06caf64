#!/usr/bin/env bash
# Fresh machine -> BERT masked-LM shards from the bundled WikiText sample, then a look at them.
# --input-format wikitext: the file is WikiText-2 (named otherwise than the dataset's
# wiki.train.tokens): an article per document, headings dropped, its paragraphs split into
# sentences, its `<unk>` read as the vocab's [UNK] and its ` @-@ ` splits undone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh core
.venv/bin/mlm-pipeline prepare sample/wikitext2-train-1MB.txt --input-format wikitext \
  --tokenizer sample/bert-base-uncased-vocab.txt --output ./out "$@"
.venv/bin/mlm-pipeline inspect ./out -n 3
