// Commands of the 'run' group. (Placeholder until that group lands.)
#include "apps/trainscope/commands.h"

namespace ts::cli {
int cmdRun(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdDemo(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
}  // namespace ts::cli
