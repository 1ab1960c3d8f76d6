"""Per-rank profiler trace analysis (`rankwatch trace`): why a step took as long as it did.

One module per job:
  jsonstream   stream a huge JSON document key by key, the event array in batches
  events       the normalised event table (numpy columns) every reader produces
  kineto       PyTorch Profiler (Kineto) Chrome-trace JSON, plain or gzipped
  nsys         Nsight Systems SQLite exports
  load         find files, read them in parallel, decide each file's rank
  steps        step windows per rank, aligned across ranks
  links        launch / host-op / annotation lookups inside one rank
  collectives  match collectives across ranks, check them, split transfer / wait
  clock        per-rank clock offsets (through rankwatch.align.clock)
  ledger       the exact per-rank, per-step time ledger
  optable      ops comparable across ranks and steps
  divergence   slow steps and their first unexplained divergence
  efficiency   MFU, HFU, bus bandwidth efficiency (peak rates in peaks)
  analysis     the pipeline; report / html render it; diff compares two runs
  synth*       synthetic per-rank traces with injected faults, for tests and benchmarks

See docs/trace.md.
"""
