// `megatrain plot JOB`: a job's loss curve drawn in the terminal, from its
// event history (JobService.WatchJob), so it works wherever the CLI
// reaches the daemon. The job's curves are also files in its output_dir
// (metrics/steps.csv, evals.csv, TensorBoard events: server/core/job_scalars.h)
// for other tools.
//
// Example:
//   megatrain plot job-000012 --width 100 --height 20
#ifndef MEGATRAIN_CLIENT_PLOT_H_
#define MEGATRAIN_CLIENT_PLOT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/time/time.h"
#include "client/connection.h"

namespace megatrain::client {

// The subcommand's flags.
struct PlotArgs {
  std::string job_id;
  int width = 72;   // plot columns, in [16, 400]
  int height = 16;  // plot rows, in [4, 100]
};

// One point of a curve: a loss at an optimizer step.
struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

// Adds `plot` to `app`, its flags bound to `*args`; returns the subcommand.
CLI::App* AddPlotCommand(CLI::App* app, PlotArgs* args);

// The chart as text: `width` columns by `height` rows of plot area, with
// a y axis of losses on the left and the first and last step below. Train
// points ('*') are averaged per column (several steps share a column when
// there are more steps than columns); eval points are drawn as 'o' over
// them. Non-finite losses are left out. "no steps to plot" when `train`
// and `eval` are empty.
std::string RenderLossChart(const std::vector<LossPoint>& train, const std::vector<LossPoint>& eval,
                            int width, int height);

// Runs `megatrain plot`: reads the job (GetJob) for its latest step, then
// its events (WatchJob from the start) until that step or the job's end,
// and prints the chart. Returns the exit code (kExitOk; kExitUsage for a
// bad flag; kExitError for an RPC error, printed on `err`).
int RunPlot(const PlotArgs& args, Connection& connection, absl::Duration timeout, std::ostream& out,
            std::ostream& err);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_PLOT_H_
