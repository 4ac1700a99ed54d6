// Tests of client/plot.h RenderLossChart: the text chart's frame, where the
// points land, per-column means, eval marks, and degenerate inputs.
#include "client/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(PlotTest, FallingLossRunsFromTopLeftToBottomRight) {
  std::vector<LossPoint> train;
  for (int step = 1; step <= 16; ++step) train.push_back({step, 17.0 - step});

  const std::vector<std::string> lines = Lines(RenderLossChart(train, {}, 16, 16));

  // Title, 16 rows, axis, step labels.
  ASSERT_EQ(lines.size(), 19u);
  EXPECT_EQ(lines[0], "loss, steps 1..16: * train");
  // 16 steps on 16 columns and 16 rows: step s at column s-1, loss 17-s at
  // row s-1 (16 at the top, 1 at the bottom).
  EXPECT_EQ(lines[1], "        16 |*" + std::string(15, ' '));
  EXPECT_EQ(lines[9], "         8 |" + std::string(8, ' ') + "*" + std::string(7, ' '));
  EXPECT_EQ(lines[16], "         1 |" + std::string(15, ' ') + "*");
  EXPECT_EQ(lines[17], std::string(11, ' ') + "+" + std::string(16, '-'));
  EXPECT_EQ(lines[18], std::string(12, ' ') + "1" + std::string(13, ' ') + "16");
}

TEST(PlotTest, StepsSharingAColumnAreAveraged) {
  // Steps 1 and 2 share column 0 of 16 (step 100 is column 15): their mean,
  // 4, tops the chart, not 5.
  const std::vector<LossPoint> train = {{1, 5.0}, {2, 3.0}, {100, 1.0}};

  const std::string chart = RenderLossChart(train, {}, 16, 4);

  EXPECT_THAT(chart, HasSubstr("         4 |*"));
  EXPECT_THAT(chart, ::testing::Not(HasSubstr("         5 |")));
  EXPECT_THAT(chart, HasSubstr("         1 |" + std::string(15, ' ') + "*"));
}

TEST(PlotTest, MoreStepsThanColumnsShowsOnePointPerColumn) {
  std::vector<LossPoint> train;
  for (int step = 1; step <= 100; ++step) train.push_back({step, step % 2 == 0 ? 1.0 : 3.0});

  const std::vector<std::string> lines = Lines(RenderLossChart(train, {}, 20, 5));

  EXPECT_EQ(lines[0], "loss, steps 1..100: * train (column mean)");
  for (int column = 0; column < 20; ++column) {
    int points = 0;
    for (int row = 1; row <= 5; ++row) points += lines[row][12 + column] == '*';
    EXPECT_EQ(points, 1) << "column " << column;
  }
}

TEST(PlotTest, EvalLossesAreMarkedOverTheTrainCurve) {
  const std::vector<LossPoint> train = {{1, 4.0}, {2, 3.0}, {3, 2.0}};
  const std::vector<LossPoint> eval = {{3, 2.5}};

  const std::vector<std::string> lines = Lines(RenderLossChart(train, eval, 16, 7));

  EXPECT_EQ(lines[0], "loss, steps 1..3: * train, o eval");
  // Losses 2..4 on rows 0..6: 2.5 at row round(4.5) = 5, step 3 at column 15.
  EXPECT_EQ(lines[1 + 5][12 + 15], 'o');
  EXPECT_EQ(lines[1 + 6][12 + 15], '*');
}

TEST(PlotTest, NonFiniteLossesAreLeftOut) {
  const std::vector<LossPoint> train = {
      {1, 3.0}, {2, std::numeric_limits<double>::quiet_NaN()}, {3, 2.0}};

  const std::string chart = RenderLossChart(train, {}, 16, 4);

  EXPECT_EQ(std::count(chart.begin(), chart.end(), '*'), 2 + 1);  // 2 points and the legend
  EXPECT_THAT(chart, HasSubstr("steps 1..3"));
}

TEST(PlotTest, NothingToPlotSaysSo) {
  EXPECT_EQ(RenderLossChart({}, {}, 16, 4), "no steps to plot\n");
}

TEST(PlotTest, OneStepIsDrawnInTheMiddleRow) {
  const std::vector<std::string> lines = Lines(RenderLossChart({{5, 2.0}}, {}, 16, 5));

  EXPECT_EQ(lines[3], "         2 |*               ");
}

}  // namespace
}  // namespace megatrain::client
