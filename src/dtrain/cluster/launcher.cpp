// Starting, watching, stopping and restarting the tasks of a local cluster.
#include "dtrain/cluster/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <nlohmann/json.hpp>

#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"
#include "dtrain/core/threads.h"

extern char** environ;

namespace dtrain::cluster {
namespace {

std::atomic<int> g_forward_signal{0};

void remember_signal(int sig) { g_forward_signal.store(sig); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGPIPE: return "SIGPIPE";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    default: return "signal " + std::to_string(sig);
  }
}

struct Task {
  TaskId id;
  pid_t pid = -1;
  int out = -1;          // read end of the task's stdout+stderr
  std::string partial;   // output after the last newline
  bool running = false;
  int status = 0;
  int stopped_by = 0;    // the signal that stopped it (SIGSTOP, SIGTSTP, ...) while it is stopped
  bool left_behind = false;  // a parameter-server job's worker that failed and the job went on without
};

// Restores the launcher's signal handlers when launch() returns.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_forward_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = remember_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalForwarding() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// `env`: "NAME=value" entries set for the task, replacing the launcher's own.
void start(Task& t, const std::vector<std::string>& command, const std::vector<std::string>& env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) DTRAIN_THROW(IoError, "dtrain launch: pipe: ", std::strerror(errno));
  // A signal that arrives between fork and exec must not run the launcher's handler in
  // the child: block them around fork, reset and unblock in the child.
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, &saved);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& mine) {
      return entry.substr(0, entry.find('=') + 1) == std::string_view(mine).substr(0, mine.find('=') + 1);
    });
    if (!replaced) env_strings.emplace_back(entry);
  }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    const std::string why = std::strerror(errno);
    sigprocmask(SIG_SETMASK, &saved, nullptr);
    close(fds[0]);
    close(fds[1]);
    DTRAIN_THROW(IoError, "dtrain launch: fork: ", why);
  }
  if (pid == 0) {
    // The child: its own process group (so that stopping a task stops what it started),
    // output into the pipe, default signal handling, then the program.
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &saved, nullptr);
    execvpe(argv[0], argv.data(), envp.data());
    const std::string msg = "dtrain launch: cannot run '" + args[0] + "': " + std::strerror(errno) + "\n";
    [[maybe_unused]] auto n = write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that it holds before the parent signals the group
  sigprocmask(SIG_SETMASK, &saved, nullptr);
  close(fds[1]);
  t.pid = pid;
  t.out = fds[0];
  t.running = true;
}

// Stops every task still running if launch() leaves early (an exception).
struct Reaper {
  std::vector<Task>& tasks;
  ~Reaper() {
    for (Task& t : tasks) {
      if (t.pid <= 0) continue;  // not started (kill(1, ...) would be init)
      kill(-t.pid, SIGKILL);
      if (t.running) waitpid(t.pid, nullptr, 0);
      if (t.out >= 0) close(t.out);
    }
  }
};

void emit_lines(Task& t, const char* data, std::size_t n, std::ostream& out, bool flush_partial) {
  t.partial.append(data, n);
  std::size_t start = 0;
  for (std::size_t nl; (nl = t.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    out << "[" << t.id.to_string() << "] " << std::string_view(t.partial).substr(start, nl - start) << "\n";
  t.partial.erase(0, start);
  if (flush_partial && !t.partial.empty()) {
    out << "[" << t.id.to_string() << "] " << t.partial << "\n";
    t.partial.clear();
  }
  out.flush();
}

// EX_TEMPFAIL (sysexits.h): a task that was told to stop (preempted) and saved a checkpoint
// first says so with it.
constexpr int kPreempted = 75;

std::string describe(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == kPreempted)
    return "exited with code 75 (preempted: saved a checkpoint and stopped)";
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

std::vector<int> free_ports(int count) {
  std::vector<int> ports, sockets;
  for (int i = 0; i < count; ++i) {
    // Held open until all are chosen, so the same port is not handed out twice.
    const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) DTRAIN_THROW(IoError, "free_ports: socket: ", std::strerror(errno));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(s);
      for (int o : sockets) close(o);
      DTRAIN_THROW(IoError, "free_ports: cannot bind a port on 127.0.0.1: ", std::strerror(errno));
    }
    sockets.push_back(s);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int s : sockets) close(s);
  return ports;
}

ClusterSpec local_cluster(int workers, int ps, bool chief, const std::vector<int>& ports) {
  ClusterSpec c;
  std::size_t next = 0;
  auto add = [&](const char* type, int n) {
    for (int i = 0; i < n; ++i) c.add_task(type, Address{"127.0.0.1", ports.at(next++)});
  };
  add("chief", chief ? 1 : 0);
  add("worker", workers);
  add("ps", ps);
  return c;
}

std::string tf_config_json(const ClusterSpec& cluster, const TaskId& task) {
  nlohmann::json j;
  for (const auto& [type, addresses] : cluster.jobs()) {
    nlohmann::json list = nlohmann::json::array();
    for (const Address& a : addresses) list.push_back(a.to_string());
    j["cluster"][type] = list;
  }
  j["task"] = {{"type", task.type}, {"index", task.index}};
  return j.dump();
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string job_token() {
  if (const char* given = std::getenv("DTRAIN_CLUSTER_TOKEN"); given && *given) return given;
  std::random_device device;
  std::ostringstream o;
  o << std::hex;
  for (int i = 0; i < 4; ++i) o << std::setw(8) << std::setfill('0') << device();
  return o.str();
}

// The launch's private directory for DTRAIN_PROGRESS_FILE (under TMPDIR, as mkdtemp(1)),
// removed with whatever the tasks left in it (a temporary they did not rename).
class ProgressDirectory {
 public:
  ProgressDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string parent = tmp && *tmp ? tmp : "/tmp";
    std::string path = parent + "/dtrain-launch-XXXXXX";
    if (!mkdtemp(path.data()))
      DTRAIN_THROW(IoError, "dtrain launch: cannot make a directory for the progress file in ", parent, ": ",
                   std::strerror(errno));
    dir_ = path;
  }
  ~ProgressDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ProgressDirectory(const ProgressDirectory&) = delete;
  ProgressDirectory& operator=(const ProgressDirectory&) = delete;

  std::string file() const { return dir_ + "/progress"; }
  // What the tasks last wrote, none before they first do. The content and not the mtime:
  // two checkpoints within the file system's timestamp granularity look the same by time.
  std::optional<std::string> read() const {
    std::ifstream in(file(), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream content;
    content << in.rdbuf();
    return content.str();
  }

 private:
  std::string dir_;
};

// How one start of the whole job ended.
struct Attempt {
  std::string failed_task, how;  // as in LaunchResult
  bool deadline_passed = false;
  std::vector<std::string> still_running;
  // A task failed by itself while the job was running: a failure that a restart may answer.
  // Not one during the stop after it, after the launcher's own SIGINT or SIGTERM, or at the
  // deadline.
  bool restartable = false;
  Clock::time_point started_at, failure_noticed_at;
};

// Starts every task with `env` ("NAME=value", TF_CONFIG added per task) on fresh ports,
// and watches them until every one has ended. `launch_started` is the deadline's origin.
// `restarts`: the restarts of the launch so far, which a parameter-server job's workers
// started again alone add to (with their causes and times in `result`).
Attempt run_attempt(const LaunchOptions& o, std::vector<std::string> env, Clock::time_point launch_started,
                    std::ostream& out, std::ostream& err, LaunchResult& launch_result) {
  const int total = o.workers + o.ps + (o.chief ? 1 : 0);
  const ClusterSpec cluster = local_cluster(o.workers, o.ps, o.chief, free_ports(total));
  std::vector<Task> tasks;
  for (const TaskId& id : cluster.tasks()) tasks.push_back(Task{id});
  // An elastic job's store is the launcher's: it outlives every worker, and removes a dead
  // one's keys with its connection.
  const bool elastic = o.min_workers > 0;
  std::unique_ptr<comm::TcpStoreServer> store;
  if (elastic) {
    std::string token;
    for (const std::string& e : env)
      if (e.rfind("DTRAIN_CLUSTER_TOKEN=", 0) == 0) token = e.substr(e.find('=') + 1);
    store = std::make_unique<comm::TcpStoreServer>("127.0.0.1", 0, token);
    env.push_back("DTRAIN_ELASTIC=" + std::to_string(o.min_workers) + ":" + std::to_string(o.workers));
    env.push_back("DTRAIN_ELASTIC_STORE=127.0.0.1:" + std::to_string(store->port()));
    if (!o.elastic_keep.empty()) env.push_back("DTRAIN_ELASTIC_KEEP=" + o.elastic_keep);
  }
  // Each task's own: its place in the cluster.
  auto task_env = [&](const Task& t) {
    std::vector<std::string> own = env;
    if (elastic) {
      own.push_back("DTRAIN_ELASTIC_ID=" + t.id.to_string());
      own.push_back("TF_CONFIG=");  // not one inherited from the launcher's environment
    } else {
      own.push_back("TF_CONFIG=" + tf_config_json(cluster, t.id));
    }
    return own;
  };
  Reaper reaper{tasks};
  Attempt result;
  for (Task& t : tasks) start(t, o.command, task_env(t));
  result.started_at = Clock::now();

  std::optional<Clock::time_point> stopping_since, all_ended_at, trainers_done_at;
  bool signalled = false;
  // A task the kernel reports stopped when another fails is the cause: the others failed
  // waiting for it (the first to fail is only the first to give up).
  // Whether `t` (running) has just ended; notes a stop or a continue on the way.
  auto poll_task = [](Task& t) {
    int status = 0;
    const pid_t r = waitpid(t.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (r == t.pid && WIFSTOPPED(status)) {
      t.stopped_by = WSTOPSIG(status);
      return false;
    }
    if (r == t.pid && WIFCONTINUED(status)) {
      t.stopped_by = 0;
      return false;
    }
    if (r == -1 && errno == ECHILD) status = 0;  // reaped elsewhere (SIGCHLD ignored): status unknown
    else if (r != t.pid) return false;
    t.running = false;
    t.status = status;
    return true;
  };
  auto stopped_task = [&]() -> const Task* {
    for (const Task& t : tasks)
      if (t.running && t.stopped_by && t.id.type != "ps") return &t;
    return nullptr;
  };
  // Signals go to each task's process group, also once the task itself has ended: what a
  // task started stops with it.
  auto stop_all = [&](int sig) {
    for (Task& t : tasks) {
      kill(-t.pid, sig);
      // A stopped task acts on SIGTERM only once continued.
      if (sig == SIGTERM && t.stopped_by) kill(-t.pid, SIGCONT);
    }
  };
  auto trainers_running = [&] {
    for (const Task& t : tasks)
      if (t.running && t.id.type != "ps") return true;
    return false;
  };
  // A parameter-server job outlives its workers: the chief runs a lost worker's closures
  // on the others, and a worker started again rejoins. Whether the job went on after
  // worker `t` failed (false: it was the last worker, and the job fails).
  const bool ps_job = o.ps > 0 && o.chief;
  const bool lone_restarts = ps_job || elastic;
  auto chief_task = [&] {
    return std::find_if(tasks.begin(), tasks.end(), [](const Task& x) { return x.id.type == "chief"; });
  };
  // Whether a task of the job has ended well (in an elastic job: the job is ending).
  auto ended_well = [&] {
    return std::any_of(tasks.begin(), tasks.end(), [](const Task& x) { return !x.running && !failed(x.status); });
  };
  auto worker_failed = [&](Task& t) {
    const std::string cause = t.id.to_string() + " " + describe(t.status);
    // What it wrote before it died comes first; what it started dies with it.
    for (pollfd p{t.out, POLLIN, 0}; t.out >= 0 && poll(&p, 1, 0) > 0;) {
      char buf[4096];
      const ssize_t n = read(t.out, buf, sizeof buf);
      if (n <= 0) break;
      emit_lines(t, buf, static_cast<std::size_t>(n), out, false);
    }
    emit_lines(t, "", 0, out, true);
    if (t.out >= 0) close(t.out);
    t.out = -1;
    kill(-t.pid, SIGKILL);
    // Once the chief is done, the job is over: nothing is left for the worker to do.
    const auto chief = chief_task();
    if (chief != tasks.end() && !chief->running) {
      t.left_behind = true;
      return !failed(chief->status);
    }
    // An elastic job one of whose workers finished is ending: no one is left to join.
    if (elastic && ended_well()) {
      t.left_behind = true;
      return true;
    }
    if (launch_result.restarts < o.max_restarts) {
      ++launch_result.restarts;
      launch_result.restart_causes.push_back(cause);
      launch_result.restart_detected_seconds.push_back(seconds_between(launch_started, Clock::now()));
      err << "dtrain launch: " << cause << "; the " << (elastic ? "elastic" : "parameter-server") << " job goes on, and "
          << t.id.to_string() << " starts again (restart " << launch_result.restarts << " of " << o.max_restarts << ")\n";
      std::vector<std::string> again = task_env(t);
      for (std::string& e : again)
        if (e.rfind("DTRAIN_RESTART_COUNT=", 0) == 0) e = "DTRAIN_RESTART_COUNT=" + std::to_string(launch_result.restarts);
      t.status = t.stopped_by = 0;
      start(t, o.command, again);
      launch_result.restart_started_seconds.push_back(seconds_between(launch_started, Clock::now()));
      return true;
    }
    // An elastic job with fewer than MIN workers left cannot go on: it fails now, naming
    // this worker, rather than after the others waited out their join timeout.
    const auto running_workers = std::count_if(tasks.begin(), tasks.end(), [](const Task& x) {
      return x.running && x.id.type == "worker";
    });
    if (elastic && running_workers < o.min_workers) {
      err << "dtrain launch: " << cause << "; the elastic job cannot go on with " << running_workers
          << " worker(s), fewer than its " << o.min_workers << (o.max_restarts > 0 ? " (no restarts left)\n" : "\n");
      return false;
    }
    if (running_workers == 0) return false;
    err << "dtrain launch: " << cause << "; the " << (elastic ? "elastic" : "parameter-server")
        << " job goes on without it" << (o.max_restarts > 0 ? " (no restarts left)" : " (--max-restarts 0)") << "\n";
    t.left_behind = true;
    return true;
  };
  for (;;) {
    // Output first, so a task's last words come before the launcher's verdict.
    std::vector<pollfd> fds;
    for (Task& t : tasks)
      if (t.out >= 0) fds.push_back({t.out, POLLIN, 0});
    if (!fds.empty() && poll(fds.data(), fds.size(), 50) > 0) {
      for (const pollfd& p : fds) {
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Task& t = *std::find_if(tasks.begin(), tasks.end(), [&](const Task& x) { return x.out == p.fd; });
        char buf[4096];
        const ssize_t n = read(t.out, buf, sizeof buf);
        if (n > 0) {
          emit_lines(t, buf, static_cast<std::size_t>(n), out, false);
        } else if (n == 0 || errno != EINTR) {
          emit_lines(t, "", 0, out, true);
          close(t.out);
          t.out = -1;
        }
      }
    } else if (fds.empty()) {
      usleep(20000);
    }
    if (const int sig = g_forward_signal.exchange(0)) {
      err << "dtrain launch: passing " << signal_name(sig) << " to every task\n";
      stop_all(sig);
      signalled = true;
      if (!stopping_since) stopping_since = Clock::now();
    }
    // The job's deadline: every task is stopped, and the ones still running are named.
    if (o.timeout_seconds > 0 && !stopping_since && seconds_between(launch_started, Clock::now()) >= o.timeout_seconds) {
      result.deadline_passed = true;
      for (const Task& t : tasks)
        if (t.running) result.still_running.push_back(t.id.to_string());
      err << "dtrain launch: the job's deadline of " << o.timeout_seconds << " s passed; stopping every task\n";
      stop_all(SIGTERM);
      stopping_since = Clock::now();
    }
    // Reap whoever ended; note who was stopped or continued.
    for (Task& t : tasks) {
      if (!t.running || !poll_task(t)) continue;
      if (lone_restarts && t.id.type == "worker" && failed(t.status) && !stopping_since && worker_failed(t)) continue;
      // A ps that ends badly once the trainers are done (stopping, or in the grace period the
      // chief's word gave it) did not fail the job.
      if (failed(t.status) && result.failed_task.empty() && !((stopping_since || trainers_done_at) && t.id.type == "ps")) {
        if (!stopping_since) {
          // A task that stopped before this one gave up has been reported by now.
          for (Task& other : tasks)
            if (other.running) poll_task(other);
          // Of the tasks found ended in this pass, one killed by a signal is the cause rather
          // than one that exited with an error: the others' errors are usually about it.
          const Task* cause = &t;
          for (const Task& other : tasks)
            if (!other.running && failed(other.status) && WIFSIGNALED(other.status) && !WIFSIGNALED(cause->status))
              cause = &other;
          const int status = cause->status;
          if (const Task* stopped = stopped_task()) {
            result.failed_task = stopped->id.to_string();
            result.how = "was stopped by signal " + std::to_string(stopped->stopped_by) + " (" +
                         signal_name(stopped->stopped_by) + ") and stopped answering (" + cause->id.to_string() + " " +
                         describe(status) + " first)";
            err << "dtrain launch: " << cause->id.to_string() << " " << describe(status) << "; " << result.failed_task
                << " is stopped (" << signal_name(stopped->stopped_by) << "); stopping the other tasks\n";
          } else {
            result.failed_task = cause->id.to_string();
            result.how = describe(status);
            err << "dtrain launch: " << result.failed_task << " " << result.how << "; stopping the other tasks\n";
          }
          stop_all(SIGTERM);
          stopping_since = result.failure_noticed_at = Clock::now();
          result.restartable = true;
        }
      }
    }
    // A worker of an elastic job that is stopped (hung) once another ended well was left out
    // at the others' collective timeout, or never came back: the job ended without it, and
    // stopped it would never end by itself.
    if (elastic && !stopping_since && ended_well())
      for (Task& t : tasks)
        if (t.running && t.stopped_by && !t.left_behind) {
          err << "dtrain launch: " << t.id.to_string() << " is stopped (" << signal_name(t.stopped_by)
              << ") and the elastic job ended without it; ending it\n";
          t.left_behind = true;
          kill(-t.pid, SIGKILL);
        }
    // Parameter servers serve until every trainer is done. A chief that ended well has told
    // them the job is over: they get the grace period to end by themselves first.
    if (!stopping_since && !trainers_running()) {
      if (!trainers_done_at) trainers_done_at = Clock::now();
      const auto chief = chief_task();
      const bool told = ps_job && chief != tasks.end() && !failed(chief->status);
      if (!told || seconds_between(*trainers_done_at, Clock::now()) > o.grace_seconds) {
        stop_all(SIGTERM);
        stopping_since = Clock::now();
      }
    }
    bool any_running = false, any_output = false;
    for (const Task& t : tasks) {
      any_running = any_running || t.running;
      any_output = any_output || t.out >= 0;
    }
    if (!any_running && !any_output) break;
    // Every task has ended, but something they started may still hold a pipe open: give
    // the output the grace period to drain, then stop reading.
    if (!any_running) {
      if (!all_ended_at) {
        all_ended_at = Clock::now();
        stop_all(SIGTERM);  // leftovers of tasks that have ended
      }
      if (seconds_between(*all_ended_at, Clock::now()) > o.grace_seconds) {
        stop_all(SIGKILL);
        for (Task& t : tasks) {
          emit_lines(t, "", 0, out, true);
          if (t.out >= 0) close(t.out);
          t.out = -1;
        }
        break;
      }
    }
    if (stopping_since && any_running && seconds_between(*stopping_since, Clock::now()) > o.grace_seconds)
      stop_all(SIGKILL);
  }
  // Reap what the tasks started (now the launcher's children), briefly: it was signalled.
  const auto reap_until = Clock::now() + std::chrono::milliseconds(500);
  for (Task& t : tasks)
    while (Clock::now() < reap_until) {
      const pid_t r = waitpid(-t.pid, nullptr, WNOHANG);
      if (r < 0) break;             // nothing left in the group
      if (r == 0) usleep(5000);     // still dying
    }
  // Asked to stop while the job was being stopped after a failure: the user's word wins.
  if (signalled) result.restartable = false;
  if (result.failed_task.empty() && !result.deadline_passed) {
    // Stopped by a forwarded signal: a trainer that did not finish cleanly still counts.
    for (const Task& t : tasks)
      if (t.id.type != "ps" && !t.left_behind && failed(t.status)) {
        result.failed_task = t.id.to_string();
        result.how = describe(t.status);
        break;
      }
  }
  return result;
}

}  // namespace

LaunchResult launch(const LaunchOptions& o) {
  if (o.command.empty()) DTRAIN_THROW(InvalidArgument, "dtrain launch: no program to run (give it after --)");
  if (o.workers < 0 || o.ps < 0 || o.workers + (o.chief ? 1 : 0) == 0)
    DTRAIN_THROW(InvalidArgument, "dtrain launch: needs at least one worker or a chief, got --workers ", o.workers);
  if (o.max_restarts < 0)
    DTRAIN_THROW(InvalidArgument, "dtrain launch: --max-restarts must be 0 or more, got ", o.max_restarts);
  if (!o.elastic_keep.empty() && (o.min_workers == 0 || (o.elastic_keep != "global_batch" && o.elastic_keep != "worker_batch")))
    DTRAIN_THROW(InvalidArgument, "dtrain launch: --elastic-keep '", o.elastic_keep, "' needs an elastic job (--workers ",
                 "MIN:MAX) and global_batch or worker_batch");
  if (o.min_workers > 0 && (o.min_workers > o.workers || o.chief || o.ps > 0))
    DTRAIN_THROW(InvalidArgument, "dtrain launch: an elastic job (--workers MIN:MAX) needs 1 <= MIN <= MAX and no --chief ",
                 "or --ps, got --workers ", o.min_workers, ":", o.workers, o.chief ? " --chief" : "",
                 o.ps > 0 ? " --ps " + std::to_string(o.ps) : std::string());
  std::ostream& out = o.out ? *o.out : std::cout;
  std::ostream& err = o.err ? *o.err : std::cerr;
  const int total = o.workers + o.ps + (o.chief ? 1 : 0);
  const auto started = Clock::now();
  SignalForwarding forwarding;
  // What the tasks leave behind is handed to the launcher rather than to init, so that it
  // can reap it below.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Only a launch that may restart needs to know whether the job makes progress.
  std::optional<ProgressDirectory> progress;
  if (o.max_restarts > 0) progress.emplace();
  // Every task gets the threads asked for, or its share of the cores unless OMP_NUM_THREADS
  // says otherwise (one process per core: as torchrun, one thread).
  std::vector<std::string> common_env;
  if (o.threads_per_task > 0)
    common_env.push_back("OMP_NUM_THREADS=" + std::to_string(o.threads_per_task));
  else if (const char* threads = std::getenv("OMP_NUM_THREADS"); !threads || !*threads)
    common_env.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, available_cores() / std::max(1, total - o.ps))));
  if (progress) common_env.push_back("DTRAIN_PROGRESS_FILE=" + progress->file());

  LaunchResult result;
  // The progress file when the current start began, and whether the program writes it at
  // all (a program that never does is restarted up to max_restarts times).
  std::optional<std::string> progress_at_start;
  bool reports_progress = false;
  for (int attempt = 0;; ++attempt) {
    // Each start is a new job for the tasks' rendezvous: a fresh token (unless given), so a
    // task left over from the last start cannot join this one.
    std::vector<std::string> env = common_env;
    env.push_back("DTRAIN_CLUSTER_TOKEN=" + job_token());
    env.push_back("DTRAIN_RESTART_COUNT=" + std::to_string(attempt));
    // A job restart's start goes before the lone worker restarts made during this attempt.
    const std::size_t job_restart_at = result.restart_started_seconds.size();
    Attempt a = run_attempt(o, env, started, out, err, result);
    if (attempt > 0)
      result.restart_started_seconds.insert(
          result.restart_started_seconds.begin() + static_cast<std::ptrdiff_t>(job_restart_at),
          seconds_between(started, a.started_at));
    result.failed_task = a.failed_task;
    result.how = a.how;
    result.deadline_passed = a.deadline_passed;
    result.still_running = a.still_running;
    if (!a.restartable || result.restarts >= o.max_restarts) break;
    const std::string cause = a.failed_task + " " + a.how;
    const std::optional<std::string> progress_now = progress->read();
    reports_progress = reports_progress || progress_now.has_value();
    if (attempt > 0 && reports_progress && progress_now == progress_at_start) {
      err << "dtrain launch: " << a.failed_task << " failed again (" << a.how
          << ") before the job made any progress since restart " << attempt << "; not restarting\n";
      break;
    }
    if (o.timeout_seconds > 0 && seconds_between(started, Clock::now()) >= o.timeout_seconds) {
      err << "dtrain launch: " << cause << "; not restarting: the job's deadline of " << o.timeout_seconds
          << " s has passed\n";
      break;
    }
    // A SIGINT or SIGTERM that came after the last task ended: nothing was left to pass it
    // to, and it still means stop.
    if (const int sig = g_forward_signal.exchange(0)) {
      err << "dtrain launch: " << cause << "; not restarting: the launcher got " << signal_name(sig) << "\n";
      break;
    }
    ++result.restarts;
    result.restart_causes.push_back(cause);
    result.restart_detected_seconds.push_back(seconds_between(started, a.failure_noticed_at));
    progress_at_start = progress_now;
    err << "dtrain launch: " << cause << "; restarting the job (restart " << result.restarts << " of "
        << o.max_restarts << ")\n";
  }
  if (result.deadline_passed) {
    result.exit_code = 124;  // as timeout(1)
    std::string running;
    for (const std::string& t : result.still_running) running += (running.empty() ? "" : ", ") + t;
    err << "dtrain launch: failed: the job's deadline of " << o.timeout_seconds << " s passed; still running then: "
        << (running.empty() ? "none" : running) << "\n";
    return result;
  }
  if (!result.failed_task.empty()) {
    result.exit_code = 1;
    err << "dtrain launch: failed: " << result.failed_task << " " << result.how << "\n";
  }
  return result;
}

}  // namespace dtrain::cluster
