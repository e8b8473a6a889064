// The tuner: search space, samplers, pruners, the study journal and driver (no LibTorch).
#include <catch2/catch.hpp>

#include "mltrain/tune/sampler.hpp"

using namespace mltrain::tune;

TEST_CASE("placeholder", "[tune]") { CHECK(detail::seed_for(0, 1) != detail::seed_for(0, 2)); }
