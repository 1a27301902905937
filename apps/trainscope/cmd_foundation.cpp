// Commands of the foundation group: knobs, validate, version, demo.
#include "apps/trainscope/commands.h"

namespace ts::cli {
int cmdKnobs(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdValidate(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
int cmdVersion(const Args&) { return 0; }
int cmdDemo(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
}  // namespace ts::cli
