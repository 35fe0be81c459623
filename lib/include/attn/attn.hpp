// attn/attn.hpp: the whole public API in one include.
#pragma once

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/mha.hpp"
#include "attn/problem.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"
