"""The run report: figures and a Markdown summary (report.md) from one or more run folders.

    run-report RUN_DIR [RUN_DIR ...] --out runs/report [--tensorboard-screenshot]

`run_folder` reads a run folder through the contract in `common/run_contract.py`, `plots`
draws the figures, `build` writes report.md, `tensorboard_screenshot` photographs
TensorBoard's scalars page. The report reads what the training stages wrote and imports none
of their code, nor torch.
"""
