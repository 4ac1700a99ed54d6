// `megatrain plot` (plot.h).
#include "client/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/output.h"

namespace megatrain::client {
namespace {

constexpr int kLabelWidth = 10;  // y-axis labels, "%10.4g"

std::vector<LossPoint> Finite(const std::vector<LossPoint>& points) {
  std::vector<LossPoint> finite;
  for (const LossPoint& p : points) {
    if (std::isfinite(p.loss)) finite.push_back(p);
  }
  return finite;
}

// The step range and loss range the chart spans.
struct ChartFrame {
  int64_t first_step = std::numeric_limits<int64_t>::max();
  int64_t last_step = std::numeric_limits<int64_t>::min();
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  int width = 0;
  int height = 0;

  int Column(int64_t step) const {
    if (last_step == first_step) return 0;
    return static_cast<int>(std::lround(static_cast<double>(step - first_step) * (width - 1) /
                                        static_cast<double>(last_step - first_step)));
  }
  int Row(double loss) const {
    if (high == low) return height / 2;
    return static_cast<int>(std::lround((high - loss) / (high - low) * (height - 1)));
  }
};

// Train losses averaged per column: column -> mean.
std::map<int, double> ColumnMeans(const std::vector<LossPoint>& train, const ChartFrame& frame) {
  std::map<int, std::pair<double, int>> sums;
  for (const LossPoint& p : train) {
    auto& [sum, count] = sums[frame.Column(p.step)];
    sum += p.loss;
    ++count;
  }
  std::map<int, double> means;
  for (const auto& [column, sum_count] : sums) {
    means[column] = sum_count.first / sum_count.second;
  }
  return means;
}

std::string Label(double value) { return absl::StrFormat("%*.4g", kLabelWidth, value); }

}  // namespace

CLI::App* AddPlotCommand(CLI::App* app, PlotArgs* args) {
  CLI::App* plot = app->add_subcommand("plot", "Draw a job's loss curve in the terminal");
  plot->add_option("job_id", args->job_id, "Job id")->required();
  plot->add_option("--width", args->width, "Plot columns, 16..400 (default 72)");
  plot->add_option("--height", args->height, "Plot rows, 4..100 (default 16)");
  return plot;
}

std::string RenderLossChart(const std::vector<LossPoint>& train_in,
                            const std::vector<LossPoint>& eval_in, int width, int height) {
  const std::vector<LossPoint> train = Finite(train_in), eval = Finite(eval_in);
  if (train.empty() && eval.empty()) return "no steps to plot\n";
  ChartFrame frame;
  frame.width = width;
  frame.height = height;
  for (const std::vector<LossPoint>* points : {&train, &eval}) {
    for (const LossPoint& p : *points) {
      frame.first_step = std::min(frame.first_step, p.step);
      frame.last_step = std::max(frame.last_step, p.step);
    }
  }
  const std::map<int, double> means = ColumnMeans(train, frame);
  for (const auto& [column, loss] : means) {
    frame.low = std::min(frame.low, loss);
    frame.high = std::max(frame.high, loss);
  }
  for (const LossPoint& p : eval) {
    frame.low = std::min(frame.low, p.loss);
    frame.high = std::max(frame.high, p.loss);
  }
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [column, loss] : means) grid[frame.Row(loss)][column] = '*';
  for (const LossPoint& p : eval) grid[frame.Row(p.loss)][frame.Column(p.step)] = 'o';

  std::string chart =
      absl::StrFormat("loss, steps %d..%d: * train%s%s\n", frame.first_step, frame.last_step,
                      train.size() > static_cast<size_t>(width) ? " (column mean)" : "",
                      eval.empty() ? "" : ", o eval");
  for (int row = 0; row < height; ++row) {
    const bool labelled = row == 0 || row == height - 1 || row == height / 2;
    const double value = frame.high == frame.low ? frame.high
                                                 : frame.high - (frame.high - frame.low) * row /
                                                                    static_cast<double>(height - 1);
    absl::StrAppend(&chart, labelled ? Label(value) : std::string(kLabelWidth, ' '), " |",
                    grid[row], "\n");
  }
  absl::StrAppend(&chart, std::string(kLabelWidth + 1, ' '), "+", std::string(width, '-'), "\n");
  const std::string first = absl::StrCat(frame.first_step);
  const std::string last = absl::StrCat(frame.last_step);
  const int gap = std::max(1, width - static_cast<int>(first.size() + last.size()));
  absl::StrAppend(&chart, std::string(kLabelWidth + 2, ' '), first, std::string(gap, ' '), last,
                  "\n");
  return chart;
}

int RunPlot(const PlotArgs& args, Connection& connection, absl::Duration timeout, std::ostream& out,
            std::ostream& err) {
  if (args.width < 16 || args.width > 400 || args.height < 4 || args.height > 100) {
    err << "megatrain: plot: --width must be in [16, 400] and --height in [4, 100], got "
        << args.width << " and " << args.height << "\n";
    return kExitUsage;
  }
  v1::GetJobRequest get;
  get.set_job_id(args.job_id);
  v1::Job job;
  absl::Status status =
      FromGrpcStatus(connection.jobs().GetJob(connection.NewContext(timeout).get(), get, &job));
  if (!status.ok()) {
    err << "megatrain: " << absl::StatusCodeToString(status.code()) << ": "
        << Printable(status.message()) << "\n";
    return kExitError;
  }
  out << Printable(job.id()) << " (" << StateName(job.state()) << ", step " << job.progress().step()
      << "/" << job.progress().max_steps() << ")\n";
  std::vector<LossPoint> train, eval;
  if (job.progress().step() > 0) {
    // The history up to the job's latest step: a running job's stream goes
    // on, so it is cancelled there.
    v1::WatchJobRequest watch;
    watch.set_job_id(args.job_id);
    std::unique_ptr<grpc::ClientContext> context = connection.NewContext(timeout);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
        connection.jobs().WatchJob(context.get(), watch);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.has_eval()) eval.push_back({event.eval().step(), event.eval().eval_loss()});
      if (!event.has_step()) continue;
      if (!event.step().skipped()) train.push_back({event.step().step(), event.step().loss()});
      if (event.step().step() >= job.progress().step()) break;
    }
    context->TryCancel();
    const grpc::Status finished = reader->Finish();
    if (!finished.ok() && finished.error_code() != grpc::StatusCode::CANCELLED) {
      status = FromGrpcStatus(finished);
      err << "megatrain: " << absl::StatusCodeToString(status.code()) << ": "
          << Printable(status.message()) << "\n";
      return kExitError;
    }
  }
  out << RenderLossChart(train, eval, args.width, args.height);
  return kExitOk;
}

}  // namespace megatrain::client
