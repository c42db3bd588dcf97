"""Training with Lightning: the LightningModule (loss, optimizer, schedule), callbacks, checkpoint writing,
launch and resume, run fingerprints, precision, the time budget, and the run itself (app.py)."""
