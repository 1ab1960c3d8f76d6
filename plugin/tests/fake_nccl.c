/*
 * fake_nccl: drive an NCCL profiler plugin the way NCCL 2.28.9 does, without
 * GPUs. See fake_nccl.h for the module map and `fake_nccl --help` for usage.
 * stdout carries exactly one line: the JSON summary of what was issued.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

struct fn_opts g_opt = {
    .scenario = "basic",
    .abi = 5,
    .ops = 8,
    .threads = 4,
    .comms = 2,
    .cycles = 1,
    .rank = 0,
    .nranks = 2,
    .nnodes = 1,
    .steps = 20,
    .seconds = 10.0,
    .seed = 1,
    .hostile = true,
    .slow_rank = -1,
    .hang_at_step = -1,
    .rdv_timeout_ms = 60000,
    .gpu_offset_ns = 500000,
    .gpu_tick_ns = 32,
};

static const char usage[] =
    "usage: fake_nccl [options] [--plugin] PLUGIN.so\n"
    "  --abi 4|5|6              profiler ABI symbol to use (default 5)\n"
    "  --scenario NAME          basic p2p coalesced graph multicomm workload concurrent-init\n"
    "                           robustness abort stress replay job (default basic)\n"
    "  --replay FILE            capture to replay (implies --scenario replay)\n"
    "  --ops N --threads T --comms C --seconds S --seed N --cycles K\n"
    "  --rank R --nranks N --nnodes N --comm-id HEX --comm-name NAME\n"
    "  --steps N --interval-sleep-us U --rendezvous DIR --rendezvous-timeout-ms MS\n"
    "  --slow-rank R --slow-from-step K --slow-cause host|gpu|transfer --slow-us U\n"
    "  --hang-at-step M\n"
    "  --gpu-offset-ns NS (default 500000) --gpu-tick-ns NS (default 32)\n"
    "  --keep-loaded --phases FILE --api-rank --no-hostile --verbose\n"
    "  --replay-keep-comms --replay-realtime\n";

enum {
  O_ABI = 256, O_SCEN, O_REPLAY, O_OPS, O_THREADS, O_COMMS, O_SECONDS, O_SEED, O_CYCLES,
  O_RANK, O_NRANKS, O_NNODES, O_COMMID, O_COMMNAME, O_STEPS, O_SLEEP, O_RDV, O_RDVTO,
  O_SLOWRANK, O_SLOWFROM, O_SLOWCAUSE, O_SLOWUS, O_HANG, O_GPUOFF, O_GPUTICK, O_KEEP,
  O_PHASES, O_APIRANK, O_NOHOSTILE, O_KEEPCOMMS, O_REALTIME, O_VERBOSE, O_PLUGIN, O_HELP
};

static const struct option long_opts[] = {
    {"abi", 1, 0, O_ABI},           {"scenario", 1, 0, O_SCEN},
    {"replay", 1, 0, O_REPLAY},     {"ops", 1, 0, O_OPS},
    {"threads", 1, 0, O_THREADS},   {"comms", 1, 0, O_COMMS},
    {"seconds", 1, 0, O_SECONDS},   {"seed", 1, 0, O_SEED},
    {"cycles", 1, 0, O_CYCLES},     {"rank", 1, 0, O_RANK},
    {"nranks", 1, 0, O_NRANKS},     {"nnodes", 1, 0, O_NNODES},
    {"comm-id", 1, 0, O_COMMID},    {"comm-name", 1, 0, O_COMMNAME},
    {"steps", 1, 0, O_STEPS},       {"interval-sleep-us", 1, 0, O_SLEEP},
    {"rendezvous", 1, 0, O_RDV},    {"rendezvous-timeout-ms", 1, 0, O_RDVTO},
    {"slow-rank", 1, 0, O_SLOWRANK}, {"slow-from-step", 1, 0, O_SLOWFROM},
    {"slow-cause", 1, 0, O_SLOWCAUSE}, {"slow-us", 1, 0, O_SLOWUS},
    {"hang-at-step", 1, 0, O_HANG}, {"gpu-offset-ns", 1, 0, O_GPUOFF},
    {"gpu-tick-ns", 1, 0, O_GPUTICK}, {"keep-loaded", 0, 0, O_KEEP},
    {"phases", 1, 0, O_PHASES},     {"api-rank", 0, 0, O_APIRANK},
    {"no-hostile", 0, 0, O_NOHOSTILE}, {"replay-keep-comms", 0, 0, O_KEEPCOMMS},
    {"replay-realtime", 0, 0, O_REALTIME}, {"verbose", 0, 0, O_VERBOSE},   {"plugin", 1, 0, O_PLUGIN},
    {"help", 0, 0, O_HELP},         {0, 0, 0, 0}};

static long num(const char *s, const char *what) {
  char *end;
  long v = strtol(s, &end, 0);
  if (*s == 0 || *end != 0) {
    fprintf(stderr, "fake_nccl: bad %s '%s'\n", what, s);
    exit(2);
  }
  return v;
}

static int slow_cause(const char *s) {
  if (!strcmp(s, "host")) return FN_SLOW_HOST;
  if (!strcmp(s, "gpu")) return FN_SLOW_GPU;
  if (!strcmp(s, "transfer")) return FN_SLOW_TRANSFER;
  fprintf(stderr, "fake_nccl: --slow-cause must be host, gpu or transfer\n");
  exit(2);
}

static void set_int_opt(int o, const char *a) {
  switch (o) {
  case O_ABI: g_opt.abi = (int)num(a, "abi"); break;
  case O_OPS: g_opt.ops = (int)num(a, "ops"); break;
  case O_THREADS: g_opt.threads = (int)num(a, "threads"); break;
  case O_COMMS: g_opt.comms = (int)num(a, "comms"); break;
  case O_CYCLES: g_opt.cycles = (int)num(a, "cycles"); break;
  case O_RANK: g_opt.rank = (int)num(a, "rank"); break;
  case O_NRANKS: g_opt.nranks = (int)num(a, "nranks"); break;
  case O_NNODES: g_opt.nnodes = (int)num(a, "nnodes"); break;
  case O_STEPS: g_opt.steps = (int)num(a, "steps"); break;
  case O_SLEEP: g_opt.interval_sleep_us = num(a, "interval"); break;
  case O_RDVTO: g_opt.rdv_timeout_ms = num(a, "timeout"); break;
  case O_SLOWRANK: g_opt.slow_rank = (int)num(a, "slow rank"); break;
  case O_SLOWFROM: g_opt.slow_from_step = (int)num(a, "slow step"); break;
  case O_SLOWUS: g_opt.slow_us = num(a, "slow us"); break;
  case O_HANG: g_opt.hang_at_step = (int)num(a, "hang step"); break;
  case O_GPUOFF: g_opt.gpu_offset_ns = num(a, "gpu offset"); break;
  case O_GPUTICK: g_opt.gpu_tick_ns = (int)num(a, "gpu tick"); break;
  }
}

static void set_opt(int o, const char *a) {
  switch (o) {
  case O_SCEN: g_opt.scenario = a; break;
  case O_REPLAY: g_opt.replay_file = a, g_opt.scenario = "replay"; break;
  case O_SECONDS: g_opt.seconds = strtod(a, NULL); break;
  case O_SEED: g_opt.seed = strtoull(a, NULL, 0); break;
  case O_COMMID: g_opt.comm_id = strtoull(a, NULL, 16), g_opt.comm_id_set = true; break;
  case O_COMMNAME: g_opt.comm_name = a; break;
  case O_RDV: g_opt.rendezvous = a; break;
  case O_SLOWCAUSE: g_opt.slow_cause = slow_cause(a); break;
  case O_KEEP: g_opt.keep_loaded = true; break;
  case O_PHASES: g_opt.phases_out = a; break;
  case O_APIRANK: g_opt.api_rank = true; break;
  case O_NOHOSTILE: g_opt.hostile = false; break;
  case O_KEEPCOMMS: g_opt.replay_keep_comms = true; break;
  case O_REALTIME: g_opt.replay_realtime = true; break;
  case O_VERBOSE: g_opt.verbose = true; break;
  case O_PLUGIN: g_opt.plugin = a; break;
  default: set_int_opt(o, a);
  }
}

static int check_opts(void) {
  if (!g_opt.plugin) return fprintf(stderr, "fake_nccl: no plugin given\n%s", usage), 2;
  if (g_opt.abi < 4 || g_opt.abi > 6) return fprintf(stderr, "fake_nccl: --abi 4, 5 or 6\n"), 2;
  if (g_opt.nranks < 1 || g_opt.nranks > FN_MAX_PEERS || g_opt.rank < 0 ||
      g_opt.rank >= g_opt.nranks)
    return fprintf(stderr, "fake_nccl: need 0 <= rank < nranks <= %d\n", FN_MAX_PEERS), 2;
  if (g_opt.threads < 1 || g_opt.comms < 1 || g_opt.cycles < 1 || g_opt.ops < 0)
    return fprintf(stderr, "fake_nccl: threads, comms, cycles must be >= 1\n"), 2;
  if (g_opt.slow_rank >= 0 && g_opt.slow_cause == FN_SLOW_NONE) g_opt.slow_cause = FN_SLOW_HOST;
  return 0;
}

static int parse_args(int argc, char **argv) {
  int o;
  while ((o = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    if (o == O_HELP) return fputs(usage, stdout), 1;
    if (o == '?') return fputs(usage, stderr), 2;
    set_opt(o, optarg);
  }
  for (int i = optind; i < argc; i++) { /* positional: PLUGIN, then a replay FILE */
    if (!g_opt.plugin)
      g_opt.plugin = argv[i];
    else if (!g_opt.replay_file)
      g_opt.replay_file = argv[i];
  }
  return check_opts();
}

int main(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc == 1 ? 0 : rc;
  for (int k = 0; k < g_opt.cycles && rc == 0; k++) {
    rc = fn_run_scenario(g_opt.scenario);
    fn_pl_unload_all(); /* every comm is finalized: NCCL would have dlclosed by now */
  }
  fn_summary_print(false);
  fn_stats_free_all();
  if (rc == 0 && __atomic_load_n(&g_failed, __ATOMIC_RELAXED)) rc = 1;
  return rc;
}
