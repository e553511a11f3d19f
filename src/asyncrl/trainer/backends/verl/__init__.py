"""The verl backend (GPU): verl 0.9's colocate_async trainer with vLLM, fed by asyncrl's window.

`config` (the run → verl's Hydra config, checked by verl) and `batch` (rows → verl's trajectory records)
import without a GPU; `backend` and `trainer` need verl's v1 trainer, Ray and TransferQueue, and run only on
a GPU machine (the trainer image).
"""
