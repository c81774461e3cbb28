// parallel/background_progress.h: moving communication in flight along while compute runs.
// MPI progresses a non-blocking collective only inside MPI calls, so a gradient bucket
// launched early in backward would otherwise sit until the next grad-ready hook, which can be
// a whole layer's products away. The gradient sync registers what drives its communication
// while backward runs; the layers' backward functions call drive_background_progress()
// between their products. Only the thread that registered it drives it (MPI is initialised
// FUNNELED; on a GPU, autograd runs device threads). No torch here.
#pragma once
#include <functional>

namespace retort::parallel {

// Registers `progress` (null clears it) for the calling thread.
void set_background_progress(std::function<void()> progress);
// Calls what is registered, once, if this is its thread and no call is already under way.
void drive_background_progress();

}  // namespace retort::parallel
