// Jobs whose phase is not built yet: they say so and exit non-zero.
#include "jobs/job.hpp"
#include "src/util/error.hpp"

namespace fastudy {

namespace {
int not_built(const char* phase) {
  throw Error(std::string("the ") + phase + " phase is not built yet in this version of fastudy",
              "see the project's open issues; the other phases can run on their own");
}
}  // namespace

}  // namespace fastudy
