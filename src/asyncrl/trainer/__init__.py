"""The trainer: the async window, the step loop, the events → rows adapter and the training backends."""
