"""The runtime between the models and the algorithms: one Batch, model-owned State, the
Executor (batching, chunked prefill, decode, captured-graph replays)."""
