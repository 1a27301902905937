// `trainscope gui ARGS...`: runs the workbench program (trainscope-gui), which lives in gui/ so
// that nothing outside gui/ links Qt. Looked up next to this program, then in the build tree
// (apps/trainscope -> gui/trainscope-gui), then on PATH.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/trainscope/commands.h"
#include "sessions/process.h"

namespace ts::cli {

int cmdGui(const Args& args) {
    namespace fs = std::filesystem;
    const fs::path self = sessions::selfExePath();
    std::string exe;
    for (const fs::path& candidate : {self.parent_path() / "trainscope-gui", self.parent_path().parent_path() / "gui" / "trainscope-gui"}) {
        std::error_code ec;
        if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) {
            exe = candidate.string();
            break;
        }
    }
    std::vector<std::string> argv = {exe.empty() ? std::string("trainscope-gui") : exe};
    for (const auto& a : args.raw()) argv.push_back(a);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (exe.empty()) ::execvp(cargv[0], cargv.data());
    else ::execv(cargv[0], cargv.data());
    return fail(1, "cannot start trainscope-gui (" + std::string(std::strerror(errno)) +
                       "): it is built when Qt 6 Widgets and Charts are found (Debian: qt6-base-dev qt6-charts-dev); "
                       "`bash scripts/start.sh` installs them and builds it");
}

}  // namespace ts::cli
