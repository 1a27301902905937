// Commands of the 'profiler' group. (Placeholder until that group lands.)
#include "apps/trainscope/commands.h"

namespace ts::cli {
int cmdAnalyze(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdImport(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdExportTrace(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
}  // namespace ts::cli
