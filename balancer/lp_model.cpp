#include "balancer/lp_model.h"

#include <glpk.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <cmath>
#include <utility>

namespace vtrain::balancer {
namespace {

// GLPK rejects (by aborting) names over 255 characters or with control
// characters; names only help a human reading write_lp's output, so they are
// made acceptable instead of refused.
std::string glpk_name(std::string_view name) {
  std::string out(name.substr(0, 255));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '_';
  }
  return out;
}

const char* intopt_code_name(int code) {
  switch (code) {
    case GLP_EBOUND: return "invalid bounds (GLP_EBOUND)";
    case GLP_EROOT: return "no optimal LP basis (GLP_EROOT)";
    case GLP_ENODFS: return "the LP relaxation is unbounded (GLP_ENODFS)";
    case GLP_EFAIL: return "the solver failed (GLP_EFAIL)";
    case GLP_EMIPGAP: return "stopped at the MIP gap tolerance (GLP_EMIPGAP)";
    case GLP_ETMLIM: return "time limit reached (GLP_ETMLIM)";
    case GLP_ESTOP: return "stopped by a callback (GLP_ESTOP)";
    default: return "unknown GLPK return code";
  }
}

const char* mip_status_name(int status) {
  switch (status) {
    case GLP_UNDEF: return "undefined (GLP_UNDEF)";
    case GLP_FEAS: return "feasible but not proven optimal (GLP_FEAS)";
    case GLP_NOFEAS: return "infeasible (GLP_NOFEAS)";
    case GLP_OPT: return "optimal (GLP_OPT)";
    default: return "unknown";
  }
}

}  // namespace

LpModel::LpModel(std::string name) : name_(std::move(name)), problem_(glp_create_prob()) {
  glp_set_prob_name(problem_, glpk_name(name_).c_str());
  glp_set_obj_dir(problem_, GLP_MIN);
}

LpModel::~LpModel() {
  if (problem_ != nullptr) glp_delete_prob(problem_);
}

LpModel::LpModel(LpModel&& other) noexcept
    : name_(std::move(other.name_)),
      problem_(std::exchange(other.problem_, nullptr)),
      seen_(std::move(other.seen_)),
      row_stamp_(other.row_stamp_) {}

LpModel& LpModel::operator=(LpModel&& other) noexcept {
  if (this != &other) {
    if (problem_ != nullptr) glp_delete_prob(problem_);
    name_ = std::move(other.name_);
    problem_ = std::exchange(other.problem_, nullptr);
    seen_ = std::move(other.seen_);
    row_stamp_ = other.row_stamp_;
  }
  return *this;
}

int LpModel::add_binary(double objective) { return add_column(GLP_BV, 0, 1, objective); }

int LpModel::add_integer(double lower, double upper, double objective) {
  return add_column(GLP_IV, lower, upper, objective);
}

int LpModel::add_continuous(double lower, double upper, double objective) {
  return add_column(GLP_CV, lower, upper, objective);
}

int LpModel::add_column(int kind, double lower, double upper, double objective) {
  assert(problem_ != nullptr);
  if (std::isnan(lower) || std::isnan(upper) || lower > upper || lower == kUnbounded ||
      upper == -kUnbounded) {
    throw BalancerError(name_ + ": column bounds [" + std::to_string(lower) + ", " +
                        std::to_string(upper) + "] are not an interval");
  }
  if (!std::isfinite(objective)) {
    throw BalancerError(name_ + ": objective coefficient " + std::to_string(objective) +
                        " is not finite");
  }
  const int j = glp_add_cols(problem_, 1);
  glp_set_col_kind(problem_, j, kind);
  if (kind != GLP_BV) {
    const bool has_lower = lower != -kUnbounded;
    const bool has_upper = upper != kUnbounded;
    int type = GLP_FR;
    if (has_lower && has_upper) type = lower == upper ? GLP_FX : GLP_DB;
    else if (has_lower) type = GLP_LO;
    else if (has_upper) type = GLP_UP;
    glp_set_col_bnds(problem_, j, type, has_lower ? lower : 0.0, has_upper ? upper : 0.0);
  }
  glp_set_obj_coef(problem_, j, objective);
  seen_.push_back(0);
  return j - 1;
}

int LpModel::add_row(std::string_view name, RowSense sense, double rhs,
                     std::span<const Term> terms) {
  assert(problem_ != nullptr);
  if (!std::isfinite(rhs)) {
    throw BalancerError(name_ + ": row " + std::string(name) + " has a non-finite right-hand side");
  }
  const int columns = column_count();
  const int stamp = ++row_stamp_;  // marks the columns already in this row
  // GLPK arrays are 1-based; element 0 is unused.
  std::vector<int> index(1, 0);
  std::vector<double> value(1, 0.0);
  index.reserve(terms.size() + 1);
  value.reserve(terms.size() + 1);
  for (const Term& term : terms) {
    if (term.column < 0 || term.column >= columns) {
      throw BalancerError(name_ + ": row " + std::string(name) + " names column " +
                          std::to_string(term.column) + " of " + std::to_string(columns));
    }
    if (!std::isfinite(term.coefficient)) {
      throw BalancerError(name_ + ": row " + std::string(name) + " has a non-finite coefficient");
    }
    if (seen_[term.column] == stamp) {
      throw BalancerError(name_ + ": row " + std::string(name) + " names column " +
                          std::to_string(term.column) + " twice");
    }
    seen_[term.column] = stamp;
    if (term.coefficient == 0) continue;
    index.push_back(term.column + 1);
    value.push_back(term.coefficient);
  }
  const int i = glp_add_rows(problem_, 1);
  glp_set_row_name(problem_, i, glpk_name(name).c_str());
  switch (sense) {
    case RowSense::kLessEqual: glp_set_row_bnds(problem_, i, GLP_UP, 0.0, rhs); break;
    case RowSense::kGreaterEqual: glp_set_row_bnds(problem_, i, GLP_LO, rhs, 0.0); break;
    case RowSense::kEqual: glp_set_row_bnds(problem_, i, GLP_FX, rhs, rhs); break;
  }
  glp_set_mat_row(problem_, i, static_cast<int>(index.size()) - 1, index.data(), value.data());
  return i - 1;
}

int LpModel::column_count() const { return glp_get_num_cols(problem_); }

int LpModel::row_count() const { return glp_get_num_rows(problem_); }

MipSolution LpModel::solve(std::string_view infeasible_message, const SolveOptions& options) {
  assert(problem_ != nullptr);
  if (column_count() == 0) throw BalancerError(name_ + ": the model has no columns");

  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  // The presolver lets glp_intopt start without an LP basis and detects
  // infeasibility early (GLP_ENOPFS).
  parm.presolve = GLP_ON;
  const auto limit_ms = options.time_limit.count();
  if (limit_ms > 0) parm.tm_lim = static_cast<int>(std::min<long long>(limit_ms, INT_MAX));

  const int code = glp_intopt(problem_, &parm);
  const int status = glp_mip_status(problem_);
  if (code == GLP_ENOPFS || (code == 0 && status == GLP_NOFEAS)) {
    throw InfeasibleError(std::string(infeasible_message));
  }
  if (code == GLP_ETMLIM) {
    throw BalancerError(name_ + ": no proven optimum within the time limit of " +
                        std::to_string(limit_ms) + " ms (solution status " +
                        mip_status_name(status) + ")");
  }
  if (code != 0) throw BalancerError(name_ + ": GLPK failed: " + intopt_code_name(code));
  if (status != GLP_OPT) {
    throw BalancerError(name_ + ": GLPK finished without an optimum: solution status " +
                        mip_status_name(status));
  }

  MipSolution solution;
  solution.objective = glp_mip_obj_val(problem_);
  const int columns = column_count();
  solution.values.resize(columns);
  for (int j = 0; j < columns; ++j) solution.values[j] = glp_mip_col_val(problem_, j + 1);
  return solution;
}

void LpModel::write_lp(const std::string& path) const {
  assert(problem_ != nullptr);
  const int previous = glp_term_out(GLP_OFF);  // glp_write_lp prints progress otherwise
  const int code = glp_write_lp(problem_, nullptr, path.c_str());
  glp_term_out(previous);
  if (code != 0) throw BalancerError(name_ + ": cannot write the LP file " + path);
}

}  // namespace vtrain::balancer
