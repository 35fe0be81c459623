#!/usr/bin/python3
"""Coefficients of the tiled kernel's float tanh (lib/src/sdpa_tiled.cpp, tanh_float).

tanh(y) = y P(y^2) / Q(y^2) on [0, LIMIT], P of degree 4 and Q of degree 4 with Q(0) = 1, fitted to the relative
error of tanh(y) / y: a linearised least-squares fit (P - f Q = 0 weighted by 1 / (f Q_previous)), reweighted towards
the minimax by the size of each point's error (Lawson's iteration), in the variable t = y^2 / LIMIT^2 for
conditioning and scaled back at the end. Prints the coefficients (constant term first) and the fit's largest
relative error. The kernel evaluates them in float; what counts is the error measured there, at every float argument
(lib/tests/tiled_test.cpp), which the rounding of the evaluation dominates (this fit's error is about 0.36 ulp).

Usage: /usr/bin/python3 tools/workshop/fit_tanh.py
"""
import numpy as np

LIMIT = 9.02  # from here on tanh(y) rounds to 1 in float
DEG_P, DEG_Q = 4, 4
ITERATIONS = 80


def fit():
    y = np.concatenate([np.linspace(1e-4, LIMIT, 20000), np.geomspace(1e-6, 1, 2000)])
    y.sort()
    t = y * y / (LIMIT * LIMIT)
    f = np.tanh(y) / y
    weight = np.ones_like(t)
    q_previous = np.ones_like(t)
    best = None
    for _ in range(ITERATIONS):
        powers_p = np.vander(t, DEG_P + 1, increasing=True)
        powers_q = np.vander(t, DEG_Q + 1, increasing=True)[:, 1:]
        a = np.hstack([powers_p, -f[:, None] * powers_q])
        w = weight / (f * q_previous)
        c, *_ = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)
        p, q = c[:DEG_P + 1], np.concatenate([[1.0], c[DEG_P + 1:]])
        q_previous = np.polyval(q[::-1], t)
        err = (np.polyval(p[::-1], t) / q_previous - f) / f
        worst = np.abs(err).max()
        if best is None or worst < best[0]:
            best = (worst, p, q)
        weight = weight * np.sqrt(np.abs(err) / worst) + 1e-3
        weight /= weight.max()
    worst, p, q = best
    scale = [LIMIT ** (-2 * k) for k in range(max(DEG_P, DEG_Q) + 1)]
    return worst, [p[k] * scale[k] for k in range(DEG_P + 1)], [q[k] * scale[k] for k in range(DEG_Q + 1)]


if __name__ == "__main__":
    worst, p, q = fit()
    print("P (y^0, y^2, ...):", ", ".join("%.17g" % v for v in p))
    print("Q (y^0, y^2, ...):", ", ".join("%.17g" % v for v in q))
    print("largest relative error of the fit on [0, %g]: %.3g" % (LIMIT, worst))
