// A mixed-integer linear programme, minimised with GLPK. The models' GLPK
// solvers (BatchSplitSolver::kGlpk, WorkspaceDivisionSolver::kGlpk) build one
// of these, solve it, and read the column values back; no GLPK type or
// header leaks out of lp_model.cpp.
//
// Columns and rows are addressed by 0-based indices in order of addition.
// Every input is validated before it reaches GLPK, because GLPK aborts the
// process on a bad index or bound instead of returning an error; a bad input
// throws BalancerError here.
//
// Thread-safety: an LpModel is not thread-safe. Distinct models may be used
// in distinct threads: GLPK keeps its environment in thread-local storage
// (Debian's libglpk40 is built that way).
#pragma once

#include <chrono>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "balancer/balancer_error.h"

struct glp_prob;  // GLPK's problem object, defined in glpk.h

namespace vtrain::balancer {

// Bound value meaning "unbounded" for add_integer / add_continuous.
inline constexpr double kUnbounded = std::numeric_limits<double>::infinity();

enum class RowSense { kLessEqual, kGreaterEqual, kEqual };

// One nonzero of a row: coefficient * column.
struct Term {
  int column = 0;
  double coefficient = 0;
};

struct SolveOptions {
  // Wall-clock limit of the branch and bound; 0 = none. Hitting it is a
  // BalancerError even when a feasible point was found, because the models
  // promise optimal plans.
  std::chrono::milliseconds time_limit{0};
};

struct MipSolution {
  double objective = 0;        // optimal objective value
  std::vector<double> values;  // per column, in order of addition; integral
                               // columns are integral up to GLPK's tolerance
};

class LpModel {
 public:
  // An empty minimisation problem; `name` appears in error messages.
  explicit LpModel(std::string name);
  ~LpModel();
  LpModel(LpModel&& other) noexcept;
  LpModel& operator=(LpModel&& other) noexcept;
  LpModel(const LpModel&) = delete;
  LpModel& operator=(const LpModel&) = delete;

  // Adds a column and returns its index. Bounds may be -kUnbounded /
  // kUnbounded; lower must not exceed upper. Objective coefficients must be
  // finite.
  int add_binary(double objective);
  int add_integer(double lower, double upper, double objective);
  int add_continuous(double lower, double upper, double objective);

  // Adds the row `sum(terms) sense rhs` and returns its index. Columns must
  // exist and appear at most once; zero coefficients are dropped. `name` is
  // kept for write_lp (GLPK truncates it to 255 characters).
  int add_row(std::string_view name, RowSense sense, double rhs, std::span<const Term> terms);

  int column_count() const;
  int row_count() const;

  // Solves to proven optimality (branch and bound with GLPK's presolver,
  // messages off). Throws InfeasibleError carrying `infeasible_message` when
  // no point satisfies every row, and BalancerError for everything else that
  // is not a proven optimum (unbounded, time limit, numerical failure).
  MipSolution solve(std::string_view infeasible_message, const SolveOptions& options = {});

  // Writes the model in CPLEX LP format, for inspection; throws
  // BalancerError when the file cannot be written.
  void write_lp(const std::string& path) const;

 private:
  int add_column(int kind, double lower, double upper, double objective);

  std::string name_;
  glp_prob* problem_ = nullptr;  // owned; null only after a move
  std::vector<int> seen_;    // per column: the add_row call that last named it
  int row_stamp_ = 0;        // add_row calls so far
};

}  // namespace vtrain::balancer
