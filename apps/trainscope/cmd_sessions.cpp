// Commands of the 'sessions' group. (Placeholder until that group lands.)
#include "apps/trainscope/commands.h"

namespace ts::cli {
int cmdRuns(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdAgent(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdCompare(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdExport(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
}  // namespace ts::cli
