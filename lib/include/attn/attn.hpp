// attn/attn.hpp: the whole public API in one include (attn/detail/ headers are internal and not included).
#pragma once

#include "attn/backward.hpp"
#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/mha.hpp"
#include "attn/options.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"
