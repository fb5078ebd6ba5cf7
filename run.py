"""``python run.py [overrides]`` in a checkout: the same as ``lightning-kd train [overrides]``.

python run.py                                   # SmolLM2-135M → 6-layer student, default corpus
python run.py debug=smoke                       # tiny models, seconds
python run.py distill.divergence=jsd data.files=[my.jsonl] hydra.run.dir=runs/a
"""

import sys

from lightning_kd.cli.train import main

if __name__ == "__main__":
    main(sys.argv[1:])
