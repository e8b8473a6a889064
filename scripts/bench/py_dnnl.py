"""Linear through oneDNN's sgemm for the expert Python baselines (Debian's PyTorch 1.13 sends
nn.Linear to the reference BLAS): a custom autograd Function calling libdnnl's dnnl_sgemm, as
mltrain's kernel route does. Inputs of any rank [..., in]; bias optional."""
import ctypes

import torch
import torch.nn as nn

_dnnl = ctypes.CDLL("libdnnl.so.2")
_sgemm = _dnnl.dnnl_sgemm
_sgemm.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]


def sgemm(a, ta, b, tb, m, n, k, out, beta=0.0):
    """out[m,n] = op(a) @ op(b) (+ beta*out); a, b contiguous row-major."""
    _sgemm(b"T" if ta else b"N", b"T" if tb else b"N", m, n, k, 1.0, a.data_ptr(), a.shape[1], b.data_ptr(),
           b.shape[1], beta, out.data_ptr(), n)
    return out


class DnnlLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        x = x.contiguous()
        m, k = x.shape
        n = w.shape[0]
        if b is None:
            y = sgemm(x, False, w, True, m, n, k, torch.empty(m, n))
        else:
            y = sgemm(x, False, w, True, m, n, k, b.expand(m, n).contiguous(), beta=1.0)
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g.contiguous()
        m, n = g.shape
        k = x.shape[1]
        gx = sgemm(g, False, w, False, m, k, n, torch.empty(m, k))
        gw = sgemm(g, True, x, False, n, k, m, torch.empty(n, k))
        return gx, gw, (g.sum(0) if ctx.has_bias else None)


class DnnlLinear(nn.Linear):
    def forward(self, x):
        lead = x.shape[:-1]
        y = DnnlLinearFn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.reshape(*lead, y.shape[-1])
