// Which launcher started `trainscope run`, read from its variables (issue #18). The
// environments below are set by hand, the way Open MPI, MPICH/Hydra, Slurm's srun and PMIx set
// them; there is no Slurm on this machine (the mpi-labelled tests run the Slurm path for real
// under mpirun with Slurm's variables substituted, see tests/parallel/mpi_run).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "apps/trainscope/mpi_launch.h"

namespace ts::cli {
namespace {

Result<LauncherEnv> detect(const std::map<std::string, std::string>& env) {
    return detectLauncher([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

TEST(LauncherEnv, NoLauncherVariablesMeansOneProcess) {
    auto e = detect({{"HOME", "/root"}, {"SLURM_JOB_ID", "77"}});
    ASSERT_TRUE(e.isOk()) << e.status().message();
    EXPECT_EQ(e->launcher, "");
    EXPECT_EQ(e->size, 1);
    EXPECT_EQ(e->rank, 0);
}

TEST(LauncherEnv, SlurmStepVariablesGiveRankSizeAndLocalRank) {
    auto e = detect({{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "8"}});
    ASSERT_TRUE(e.isOk()) << e.status().message();
    EXPECT_EQ(e->launcher, "slurm");
    EXPECT_EQ(e->rank, 5);
    EXPECT_EQ(e->size, 8);
    EXPECT_EQ(e->localRank, 1);
    EXPECT_NE(e->variables.find("SLURM_PROCID=5"), std::string::npos);
}

TEST(LauncherEnv, ABatchScriptWithoutAStepIsNotALaunch) {
    // sbatch sets SLURM_PROCID=0 and SLURM_NTASKS for the batch script itself; only srun sets
    // SLURM_STEP_NUM_TASKS. trainscope run straight from the script is one process.
    auto e = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "77"}});
    ASSERT_TRUE(e.isOk());
    EXPECT_EQ(e->size, 1);
    EXPECT_EQ(e->launcher, "");
}

TEST(LauncherEnv, MpirunInsideASlurmJobIsOpenMpi) {
    // mpirun's processes inherit the job's Slurm variables; Open MPI's own ones win.
    auto e = detect({{"SLURM_PROCID", "0"},
                     {"SLURM_STEP_NUM_TASKS", "1"},
                     {"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
    ASSERT_TRUE(e.isOk());
    EXPECT_EQ(e->launcher, "openmpi");
    EXPECT_EQ(e->rank, 3);
    EXPECT_EQ(e->size, 4);
    EXPECT_EQ(e->localRank, 3);
}

TEST(LauncherEnv, MpichAndPmix) {
    auto m = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}});
    ASSERT_TRUE(m.isOk());
    EXPECT_EQ(m->launcher, "mpich");
    EXPECT_EQ(m->rank, 1);
    EXPECT_EQ(m->size, 2);
    auto p = detect({{"PMIX_RANK", "2"}, {"PMIX_SIZE", "3"}});
    ASSERT_TRUE(p.isOk());
    EXPECT_EQ(p->launcher, "pmix");
    EXPECT_EQ(p->rank, 2);
    EXPECT_EQ(p->localRank, 0);
}

TEST(LauncherEnv, MalformedVariablesAreNamed) {
    auto a = detect({{"SLURM_PROCID", "x1"}, {"SLURM_STEP_NUM_TASKS", "2"}});
    ASSERT_FALSE(a.isOk());
    EXPECT_NE(a.status().message().find("SLURM_PROCID"), std::string::npos) << a.status().message();
    auto b = detect({{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}});  // rank not below size
    ASSERT_FALSE(b.isOk());
    EXPECT_NE(b.status().message().find("SLURM_STEP_NUM_TASKS=2"), std::string::npos) << b.status().message();
    auto c = detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "zero"}});
    ASSERT_FALSE(c.isOk());
    EXPECT_NE(c.status().message().find("OMPI_COMM_WORLD_SIZE"), std::string::npos) << c.status().message();
    auto d = detect({{"PMI_SIZE", "2"}});  // size without rank
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("PMI_RANK"), std::string::npos) << d.status().message();
}

}  // namespace
}  // namespace ts::cli
