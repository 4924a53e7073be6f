// SIGINT (Ctrl-C), SIGTERM (what Slurm and Kubernetes send on preemption)
// and SIGHUP (a closed terminal) stop a job cleanly: the handler only records
// the signal; the work checks for it where it counts bytes (progress_add)
// and before an output is renamed into place, and unwinds with an
// Interrupted error, so every temporary output is removed by its owner on
// the way out. main prints one line and exits 128 + the signal. A second
// signal while that happens exits at once.
#pragma once

namespace ckpt {

void install_interrupt_handlers();
// The signal received, or 0.
int interrupted_signal();
// Throws Interrupted ("interrupted by SIGTERM") once a signal was received,
// and DataLoss once an input shrank under the job (note_input_shrank).
void check_interrupted();
// An input file was truncated while the job read it through a mapping (a
// checkpoint rewritten by a job still running): its missing pages now read
// as zeros (io/mapped_inputs.h), and the job stops at its next check, so no
// output made of those zeros is published. Async-signal-safe; the path is
// copied (at most 511 bytes).
void note_input_shrank(const char* path);
// "SIGINT", "SIGTERM", "SIGHUP".
const char* signal_name(int sig);
// When the environment's CKPTCONV_TEST_STOP_AT is `step`, the process
// SIGKILLs itself here, as a crash, an OOM kill or a node lost would stop
// it (no handler runs, nothing is cleaned): how tests reach what such a
// stop leaves at a named step. Without the variable it does nothing.
void stop_here_for_tests(const char* step);

}  // namespace ckpt
