"""How much of the claimed per-canary signal the layer designs reach, and what a norm formula that undercounts
does to it: a numpy simulation, no DP library (the perfect-attacker ceiling of dpverify's layer designs).

The designs lift a record to a sequence of T equal positions (16 for the embedding, 9 for the linear layer, 4
for the LayerNorm) and sum the layer's outputs over them, so a
record's gradient on its own parameters is T times one position's, and a norm formula that takes the positions
as separate rows (the squared norms summed, not the gradient summed first) states sqrt(T) times too little.

- embedding: canary j is token j; its embedding row E_j (K = classes wide, zero) is its logits, T E_j.
  Correct norm T |u| (u = softmax - onehot); the undercounting formula sqrt(T) |u| (repeated tokens not grouped).
- linear_3d: canary j is s e_j at every position, label j k + y in its own block of k outputs of a
  Linear(m -> m k) with bias (zero); logits T (W x + b). Its own parameters: row c of W at column j, and b_c.
  Correct norm T |u| sqrt(1 + s^2); Opacus #751's bias formula sqrt(T) |u| for the bias part (s = 0.125).
- layer_norm: canary j is e_c on its label c = j k + y of the m k outputs of a LayerNorm(m k) whose weight and
  bias (zero) make the logits T (gamma * xhat + beta). Its own parameters: gamma_c and beta_c. Correct norm
  T |u * (xhat, 1)|; a sampler that averages the positions states 1/T of it. lr 1/8 (its xhat_c is sqrt(m k)).

Inclusion design, full batch (q = 1), `steps` DP-SGD steps, clipping C, noise sigma C, mean over m/2: the
claimed run is mu-GDP with mu = sqrt(steps)/sigma. Printed: separation of members' and non-members' scores in
units of the non-members' spread, over the claimed mu (1 = the whole claimed signal).

    python benchmarks/layer_sim.py [design ...]

Measured (rng seed 0): separation/mu of the correct mechanism 0.98-1.17, of the undercounting formula 3.9-4.0
(embedding), 2.8-2.9 (linear_3d); layer_norm 0.94-1.11 and 4.0-4.2.
"""
import sys

import numpy as np
from scipy.special import log_softmax, softmax

m, steps, C, lr = 2000, 10, 0.5, 2.0
#: dpverify.config.LAYER_SETTINGS: positions T, and the linear layer's input s.
POSITIONS, S = {"embedding": 16, "linear_3d": 9, "layer_norm": 4}, 0.125
LEARNING_RATE = {"embedding": lr, "linear_3d": lr, "layer_norm": 0.125}


def run(design: str, *, mu_claim: float, undercount: bool, rng: np.random.Generator, s: float = S, k: int = 10):
    sigma = np.sqrt(steps) / mu_claim
    member = rng.random(m) < 0.5
    T, lr = POSITIONS[design], LEARNING_RATE[design]
    if design == "embedding":
        y = rng.integers(0, k, m)
        E = np.zeros((m, k))  # row j: token j
        onehot = np.eye(k)[y]
        for _ in range(steps):
            u = softmax(T * E, axis=1) - onehot
            grad = T * u
            true = np.linalg.norm(grad, axis=1)
            stated = true / np.sqrt(T) if undercount else true
            factor = np.minimum(1.0, C / stated) * member
            E -= lr * (grad * factor[:, None] + rng.normal(0, sigma * C, E.shape)) / (m / 2)
        logp = log_softmax(T * E, axis=1)
        own = logp[np.arange(m), y]
        score = own - (logp.sum(1) - own) / (k - 1)
    elif design == "layer_norm":
        K = m * 2
        y = 2 * np.arange(m) + rng.integers(0, 2, m)
        xhat = np.full((K, m), -1.0 / K)
        xhat[y, np.arange(m)] += 1.0
        xhat /= np.sqrt((1.0 / K) * (1 - 1.0 / K))  # column j: canary j's normalised input
        gamma, beta = np.zeros(K), np.zeros(K)
        for _ in range(steps):
            u = softmax(T * (gamma[:, None] * xhat + beta[:, None]), axis=0)
            u[y, np.arange(m)] -= 1.0
            grad_g, grad_b = T * u * xhat, T * u
            true = np.sqrt((grad_g**2).sum(0) + (grad_b**2).sum(0))
            factor = np.minimum(1.0, C / (true / T if undercount else true)) * member
            gamma -= lr * ((grad_g * factor).sum(1) + rng.normal(0, sigma * C, K)) / (m / 2)
            beta -= lr * ((grad_b * factor).sum(1) + rng.normal(0, sigma * C, K)) / (m / 2)
        logp = log_softmax(T * (gamma[:, None] * xhat + beta[:, None]), axis=0)
        own = logp[y, np.arange(m)]
        score = own - (logp.sum(0) - own) / (K - 1)
    else:
        K = m * 2
        y = 2 * np.arange(m) + rng.integers(0, 2, m)
        W, b = np.zeros((K, m)), np.zeros(K)  # W[:, j] is input coordinate j
        for _ in range(steps):
            logits = T * (W * s + b[:, None])  # column j: canary j's logits
            u = softmax(logits, axis=0)
            u[y, np.arange(m)] -= 1.0
            grad_W, grad_b = T * s * u, T * u  # canary j: column j of W, and all of b (mostly b_{y_j})
            bias_norm2 = (grad_b**2).sum(0) / (T if undercount else 1)
            stated = np.sqrt((grad_W**2).sum(0) + bias_norm2)
            factor = np.minimum(1.0, C / stated) * member
            W -= lr * (grad_W * factor + rng.normal(0, sigma * C, W.shape)) / (m / 2)
            b -= lr * ((grad_b * factor).sum(1) + rng.normal(0, sigma * C, K)) / (m / 2)
        logp = log_softmax(T * (W * s + b[:, None]), axis=0)
        own = logp[y, np.arange(m)]
        score = own - (logp.sum(0) - own) / (K - 1)
    return (score[member].mean() - score[~member].mean()) / score[~member].std() / mu_claim


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for design in sys.argv[1:] or POSITIONS:
        for mu in (0.5, 1.0, 2.0):
            correct = run(design, mu_claim=mu, undercount=False, rng=rng)
            buggy = run(design, mu_claim=mu, undercount=True, rng=rng)
            print(f"{design}: claimed mu {mu}: separation/mu correct {correct:.2f}, undercounting formula {buggy:.2f}")
