// Child processes with pipes: fork + exec with close-on-exec pipes (see process.h).
#include "sessions/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace ts::sessions {

namespace {

void closeFd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

}  // namespace

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
        closeFd(m_in);
        closeFd(m_out);
        closeFd(m_err);
        m_pid = o.m_pid;
        m_ownGroup = o.m_ownGroup;
        m_reaped = o.m_reaped;
        m_status = o.m_status;
        m_in = o.m_in;
        m_out = o.m_out;
        m_err = o.m_err;
        o.m_pid = -1;
        o.m_in = o.m_out = o.m_err = -1;
        o.m_reaped = true;
    }
    return *this;
}

ChildProcess::~ChildProcess() {
    closeFd(m_in);
    closeFd(m_out);
    closeFd(m_err);
}

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
    if (argv.empty()) return Status::invalid("empty command");
    int inPipe[2] = {-1, -1}, outPipe[2] = {-1, -1}, errPipe[2] = {-1, -1}, execPipe[2] = {-1, -1};
    auto closeAll = [&] {
        for (int* p : {inPipe, outPipe, errPipe, execPipe})
            for (int i = 0; i < 2; ++i) closeFd(p[i]);
    };
    if ((options.pipeStdin && ::pipe2(inPipe, O_CLOEXEC) != 0) ||
        (options.pipeStdout && ::pipe2(outPipe, O_CLOEXEC) != 0) ||
        (options.pipeStderr && ::pipe2(errPipe, O_CLOEXEC) != 0) || ::pipe2(execPipe, O_CLOEXEC) != 0) {
        int e = errno;
        closeAll();
        return Status::io(std::string("pipe: ") + std::strerror(e));
    }
    // Everything the child needs is prepared before fork (no allocation after fork in a
    // multi-threaded parent).
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> envStore;
    for (char** e = environ; *e; ++e) envStore.emplace_back(*e);
    for (const auto& e : options.extraEnv) envStore.push_back(e);
    std::vector<char*> envp;
    for (auto& e : envStore) envp.push_back(e.data());
    envp.push_back(nullptr);

    pid_t pid = ::fork();
    if (pid < 0) {
        int e = errno;
        closeAll();
        return Status::io(std::string("fork: ") + std::strerror(e));
    }
    if (pid == 0) {
        if (options.newProcessGroup) ::setpgid(0, 0);
        // Signals the parent ignores (SIGPIPE) would stay ignored across exec; restore them.
        ::signal(SIGPIPE, SIG_DFL);
        int devnull = ::open("/dev/null", O_RDWR);
        ::dup2(options.pipeStdin ? inPipe[0] : devnull, 0);
        if (options.pipeStdout) ::dup2(outPipe[1], 1);
        if (options.pipeStderr) ::dup2(errPipe[1], 2);
        ::execvpe(args[0], args.data(), envp.data());
        int e = errno;
        ssize_t w = ::write(execPipe[1], &e, sizeof e);
        (void)w;
        ::_exit(127);
    }
    closeFd(execPipe[1]);
    int execErr = 0;
    ssize_t r;
    do r = ::read(execPipe[0], &execErr, sizeof execErr);
    while (r < 0 && errno == EINTR);
    closeFd(execPipe[0]);
    if (r == sizeof execErr) {
        ::waitpid(pid, nullptr, 0);
        closeAll();
        return Status::notFound("cannot run '" + argv[0] + "': " + std::strerror(execErr));
    }
    ChildProcess c;
    c.m_pid = pid;
    c.m_ownGroup = options.newProcessGroup;
    if (options.pipeStdin) { c.m_in = inPipe[1]; closeFd(inPipe[0]); }
    if (options.pipeStdout) { c.m_out = outPipe[0]; closeFd(outPipe[1]); }
    if (options.pipeStderr) { c.m_err = errPipe[0]; closeFd(errPipe[1]); }
    return c;
}

void ChildProcess::closeStdin() { closeFd(m_in); }

void ChildProcess::signal(int sig) const {
    if (m_pid <= 0 || m_reaped) return;
    if (m_ownGroup) ::kill(-m_pid, sig);
    else ::kill(m_pid, sig);
}

int ChildProcess::wait() {
    if (m_pid <= 0) return -1;
    if (m_reaped) return m_status;
    int st = 0;
    pid_t r;
    do r = ::waitpid(m_pid, &st, 0);
    while (r < 0 && errno == EINTR);
    m_reaped = true;
    m_status = r == m_pid ? st : -1;
    return m_status;
}

bool ChildProcess::tryWait(int* status) {
    if (m_pid <= 0) return false;
    if (!m_reaped) {
        int st = 0;
        pid_t r = ::waitpid(m_pid, &st, WNOHANG);
        if (r == 0) return false;
        m_reaped = true;
        m_status = r == m_pid ? st : -1;
    }
    if (status) *status = m_status;
    return true;
}

std::string describeWaitStatus(int status) {
    if (status < 0) return "exit status unknown";
    if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char* abbrev = sigabbrev_np(sig);
        std::string s = "killed by signal " + std::to_string(sig);
        if (abbrev) s += std::string(" (SIG") + abbrev + ")";
        return s;
    }
    return "stopped (status " + std::to_string(status) + ")";
}

std::string selfExePath() {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "";
    buf[n] = 0;
    return buf;
}

Status writeAll(int fd, const char* data, size_t n) {
    struct stat st {};
    const bool isSocket = ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
    while (n > 0) {
        ssize_t w = isSocket ? ::send(fd, data, n, MSG_NOSIGNAL) : ::write(fd, data, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return Status::io(std::string("write: ") + std::strerror(errno));
        }
        data += w;
        n -= size_t(w);
    }
    return Status::ok();
}

std::vector<std::string> splitCommand(const std::string& command) {
    std::vector<std::string> out;
    std::istringstream in(command);
    std::string w;
    while (in >> w) out.push_back(w);
    return out;
}

}  // namespace ts::sessions
