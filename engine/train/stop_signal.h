// engine/train/stop_signal.h: pre-emption by signal. engine_train installs handlers for
// SIGTERM and SIGINT: the first signal only raises a flag, which the ranks agree on at the
// end of each step (Trainer::train_step's one small all-reduce), so every rank finishes the
// same step, saves one checkpoint and exits 0; a second signal ends the process at once
// (exit code 128 + signal). No torch here.
#pragma once

namespace retort::engine {

// Installs the handlers (idempotent). Only programs that honour the flag should call it:
// without the handlers the signals keep their default action.
void install_stop_signal_handlers();
// The first stop signal received by this process, 0 for none.
int stop_signal_received();
// The signal's name ("SIGTERM"), for messages.
const char* stop_signal_name(int signal);

}  // namespace retort::engine
