"""Live monitoring: `rankwatch monitor` and what it is made of (docs/monitor.md).

  protocol   the stream protocol (docs/stream-protocol.md): frames, hello, lines
  listener   Unix and TCP listeners (token, limits, rejections counted)
  watch      tailing record files as they grow (--watch)
  sender     a Python sender of the protocol (replays record files)
  intake     the bounded hand-off from transports to processing
  convert    lines into the store's tables, with the store's own readers
  live       every job: routing, findings not reported before, snapshots
  job        one job: warm-up, the detectors' Stream, rebuilds, its end
  lateness   per-rank lateness and its heatmap
  traffic    bytes and time per collective and size class
  metrics    the Prometheus exposition
  web        HTTP: /, /api/state, /metrics
  alerts     stdout and webhook alerts
  parquet    rolling Parquet output
  monitor    the process: threads, ticks, shutdown
  attach     a monitor beside one job (`rankwatch run --monitor`)

`LiveState.accept` (live.py) takes decoded lines from any transport.
"""
