"""The run report: figures and a Markdown summary (report.md) from one or more run folders.

    run-report RUN_DIR [RUN_DIR ...] --out runs/report [--tensorboard-screenshot]

`run_folder` reads a run folder through the contract in `common/run_contract.py`; `sections`
holds each kind of run's section, built from `tables` and `figures` (which tags each curve
figure draws; `plots` draws them); `build` writes report.md; `tensorboard_screenshot`
photographs TensorBoard's scalars page. The report imports no training code, nor torch.
"""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
