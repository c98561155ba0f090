// MPI implementation of Communicator. The only file that includes mpi.h.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "worker/comm/communicator.h"
#include "worker/comm/half_sum.h"
#include "worker/comm/peer_probe.h"
#include "common/host_stream.h"

namespace vtrain::worker {
namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(std::string("MPI ") + what + " failed: " + std::string(text, len));
  }
}

// The MPI_Op functions of the 16-bit sums (MPI_UINT16_T elements).
void bf16_sum(void* in, void* inout, int* count, MPI_Datatype*) {
  add_half_elements(in, inout, *count, common::DataType::kBF16);
}
void f16_sum(void* in, void* inout, int* count, MPI_Datatype*) {
  add_half_elements(in, inout, *count, common::DataType::kF16);
}

// An MPI_Op of our own, freed with the communicator (unless MPI is gone).
class HalfSumOp {
 public:
  explicit HalfSumOp(MPI_User_function* fn) { check(MPI_Op_create(fn, 1, &op_), "Op_create"); }
  ~HalfSumOp() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&op_);
  }
  HalfSumOp(const HalfSumOp&) = delete;
  HalfSumOp& operator=(const HalfSumOp&) = delete;
  MPI_Op get() const { return op_; }

 private:
  MPI_Op op_ = MPI_OP_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  // Over `comm`, which the communicator frees on destruction when `owned`.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    try {
      thread_.wait_all();
    } catch (...) {
      // Destruction during error handling: the error was reported already.
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_async(void* data, int64_t count, common::DataType type) override {
    if (size_ == 1) return;  // a sum over one rank is the identity
    thread_.enqueue([this, data, count, type] {
      const auto start = std::chrono::steady_clock::now();
      const bool f32 = type == common::DataType::kF32;
      const MPI_Datatype element = f32 ? MPI_FLOAT : MPI_UINT16_T;
      const MPI_Op sum = f32 ? MPI_SUM
                             : (type == common::DataType::kBF16 ? bf16_sum_ : f16_sum_).get();
      // MPI counts are int: reduce very large buffers in pieces.
      constexpr int64_t kChunk = int64_t{1} << 30;
      for (int64_t done = 0; done < count; done += kChunk) {
        const int n = static_cast<int>(std::min(kChunk, count - done));
        char* piece = static_cast<char*>(data) + done * common::element_bytes(type);
        check(MPI_Allreduce(MPI_IN_PLACE, piece, n, element, sum, comm_), "Allreduce");
      }
      allreduce_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    thread_.wait_all();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double allreduce_seconds() const override { return allreduce_seconds_; }
  double wait_seconds() const override { return wait_seconds_; }

  void allreduce_sum(std::vector<double>& values) override {
    if (size_ == 1) return;
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                        MPI_SUM, comm_),
          "Allreduce");
  }
  void broadcast(std::vector<float>& values, int root) override {
    if (size_ == 1) return;
    uint64_t count = values.size();
    check(MPI_Bcast(&count, 1, MPI_UINT64_T, root, comm_), "Bcast");
    values.resize(count);
    constexpr uint64_t kChunk = uint64_t{1} << 30;
    for (uint64_t done = 0; done < count; done += kChunk) {
      check(MPI_Bcast(values.data() + done, static_cast<int>(std::min(kChunk, count - done)),
                      MPI_FLOAT, root, comm_),
            "Bcast");
    }
  }
  void broadcast(std::string& text, int root) override {
    if (size_ == 1) return;
    uint64_t length = text.size();
    check(MPI_Bcast(&length, 1, MPI_UINT64_T, root, comm_), "Bcast");
    text.resize(length);
    check(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, comm_), "Bcast");
  }
  std::vector<std::string> gather(const std::string& text, int root) override {
    if (size_ == 1) return {text};
    int length = static_cast<int>(text.size());
    std::vector<int> lengths(rank_ == root ? size_ : 0);
    check(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_),
          "Gather");
    std::vector<int> offsets(lengths.size(), 0);
    int total = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      offsets[i] = total;
      total += lengths[i];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check(MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                      MPI_CHAR, root, comm_),
          "Gatherv");
    std::vector<std::string> out;
    for (size_t i = 0; i < lengths.size(); ++i) out.push_back(all.substr(offsets[i], lengths[i]));
    return out;
  }
  void barrier() override { check(MPI_Barrier(comm_), "Barrier"); }
  void barrier_while(const std::function<void()>& work) override {
    if (size_ == 1) return;
    // Always the non-blocking barrier, with work or without: it does not
    // match a blocking MPI_Barrier on the other ranks.
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &request), "Ibarrier");
    if (!work) {
      check(MPI_Wait(&request, MPI_STATUS_IGNORE), "Wait");
      return;
    }
    for (int done = 0;;) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "Test");
      if (done) return;
      work();
    }
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; be certain
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  HalfSumOp bf16_sum_{bf16_sum};
  HalfSumOp f16_sum_{f16_sum};
  common::HostStream thread_;  // the communication thread
  double allreduce_seconds_ = 0;  // written by the communication thread only
  double wait_seconds_ = 0;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  // Multiple if the library offers it: make_separate_mpi_communicator's
  // collectives run beside another communicator's on another thread.
  check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw std::runtime_error("this MPI library does not support MPI_THREAD_SERIALIZED");
  }
  // Errors come back as return codes, which check() turns into exceptions.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiRuntime::~MpiRuntime() { MPI_Finalize(); }

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

std::unique_ptr<Communicator> make_separate_mpi_communicator() {
  int provided = 0;
  check(MPI_Query_thread(&provided), "Query_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "this MPI library does not support MPI_THREAD_MULTIPLE, which a second communicator "
        "used beside the gradient allreduces needs (model.batch_norm: sync with several ranks; "
        "model.batch_norm: local does without)");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "Comm_dup");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(comm, true);
}

std::unique_ptr<Communicator> make_mpi_subcommunicator(int color) {
  if (color < 0) throw std::invalid_argument("make_mpi_subcommunicator: color must be >= 0");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &comm), "Comm_split");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(comm, true);
}

namespace {

// A ping is a synchronous send of one byte (MPI_Issend): it completes once
// the other rank's posted receive has matched it, that is once that rank
// answered. Each rank keeps one receive from any rank posted.
class MpiPeerProbe final : public PeerProbe {
 public:
  explicit MpiPeerProbe(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    post();
  }
  ~MpiPeerProbe() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (incoming_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&incoming_);
      MPI_Wait(&incoming_, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
  }
  MpiPeerProbe(const MpiPeerProbe&) = delete;
  MpiPeerProbe& operator=(const MpiPeerProbe&) = delete;

  void answer() override {
    for (int done = 1; done;) {
      check(MPI_Test(&incoming_, &done, MPI_STATUS_IGNORE), "Test");
      if (done) post();
    }
  }

  std::vector<int> silent_ranks(std::chrono::milliseconds window) override {
    std::vector<MPI_Request> pings(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) check(MPI_Issend(&byte_, 1, MPI_CHAR, r, kTag, comm_, &pings[r]), "Issend");
    }
    const auto deadline = std::chrono::steady_clock::now() + window;
    std::vector<int> silent;
    for (;;) {
      answer();
      silent.clear();
      for (int r = 0; r < size_; ++r) {
        int done = 1;
        if (pings[r] != MPI_REQUEST_NULL) check(MPI_Test(&pings[r], &done, MPI_STATUS_IGNORE), "Test");
        if (!done) silent.push_back(r);
      }
      if (silent.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The pings still out are left to the job's end (the caller aborts it).
    return silent;
  }

 private:
  static constexpr int kTag = 7;
  void post() { check(MPI_Irecv(&inbox_, 1, MPI_CHAR, MPI_ANY_SOURCE, kTag, comm_, &incoming_), "Irecv"); }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Request incoming_ = MPI_REQUEST_NULL;
  char inbox_ = 0;
  char byte_ = 0;
};

}  // namespace

std::unique_ptr<PeerProbe> make_mpi_peer_probe() {
  int size = 1, provided = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  check(MPI_Query_thread(&provided), "Query_thread");
  if (size == 1 || provided < MPI_THREAD_MULTIPLE) return nullptr;
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "Comm_dup");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiPeerProbe>(comm);
}

void abort_job_if_parallel(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace vtrain::worker
