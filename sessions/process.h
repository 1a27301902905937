// Child processes with pipes (POSIX): what the agent uses to run each training run out of
// process, and what NodeClient uses to reach `trainscope agent --stdio` locally or over ssh.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace ts::sessions {

struct SpawnOptions {
    bool pipeStdin = false;       // else /dev/null
    bool pipeStdout = true;       // else inherited
    bool pipeStderr = false;      // else inherited
    bool newProcessGroup = true;  // so a cancel can signal the run and everything it started
    std::vector<std::string> extraEnv;  // "KEY=value" added to the environment
};

// A spawned child. Pipe fds are close-on-exec in the parent and owned by this object.
// Destruction closes the pipes but neither kills nor reaps the child (call wait()).
class ChildProcess {
public:
    static Result<ChildProcess> spawn(const std::vector<std::string>& argv, const SpawnOptions& options = {});

    ChildProcess() = default;
    ChildProcess(ChildProcess&& o) noexcept;
    ChildProcess& operator=(ChildProcess&& o) noexcept;
    ~ChildProcess();

    pid_t pid() const { return m_pid; }
    int stdinFd() const { return m_in; }
    int stdoutFd() const { return m_out; }
    int stderrFd() const { return m_err; }
    void closeStdin();
    // Signals the child (its whole process group when it has its own).
    void signal(int sig) const;
    // Blocks until the child exits; returns the raw waitpid status (or -1 when already reaped).
    int wait();
    // Non-blocking: true and the status once the child has exited.
    bool tryWait(int* status);
    bool reaped() const { return m_reaped; }

private:
    pid_t m_pid = -1;
    bool m_ownGroup = false;
    bool m_reaped = false;
    int m_status = -1;
    int m_in = -1, m_out = -1, m_err = -1;
};

// Human text for a waitpid status: "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string describeWaitStatus(int status);
// This program's executable (/proc/self/exe resolved), "" if unknown.
std::string selfExePath();
// Writes all bytes (retrying on EINTR/short writes; never raises SIGPIPE on sockets).
Status writeAll(int fd, const char* data, size_t n);
// Splits a command line on whitespace (no quoting rules): "sh -c" -> {"sh", "-c"}.
std::vector<std::string> splitCommand(const std::string& command);

}  // namespace ts::sessions
