"""tex.splits_to_offsets[_multi] emulated from the kernel's definition (common/util/splits_to_offsets.cu): output i is
the inclusive prefix sum of the split sizes times strides[i], after a leading 0 where asked, in dtypes[i] (an int32
output keeps the low 32 bits). Written from the definition with Python integers, not from the emulation's scan."""
import pytest
import torch

from te_verify.te.tecpu.grouped_offsets import splits_to_offsets, splits_to_offsets_multi


def _expected(sizes: list[int], stride: int, leading_zero: bool, bits: int) -> list[int]:
    out, total = ([0] if leading_zero else []), 0
    for size in sizes:
        total += size
        out.append(total * stride)
    if bits == 32:  # static_cast<int32_t>: two's complement of the low 32 bits
        out = [((v + 2**31) % 2**32) - 2**31 for v in out]
    return out


@pytest.mark.parametrize("input_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("sizes", [[5], [0, 0, 3], [12345, 0, 8192, 1, 65536, 100, 131072, 7], [1024] * 300])
def test_multi_scans_every_output_by_its_stride(sizes, input_dtype):
    strides, zeros = [1, 1, 7168, 0, 7185], [False, True, True, True, True]
    dtypes = [torch.int32, torch.int64, torch.int64, torch.int64, torch.int64]
    sizes_out, outputs = splits_to_offsets_multi(torch.tensor(sizes, dtype=input_dtype), torch.device("cpu"),
                                                 strides=strides, include_leading_zero=zeros, dtypes=dtypes)
    assert sizes_out.dtype == torch.int64 and sizes_out.tolist() == sizes
    for output, stride, zero, dtype in zip(outputs, strides, zeros, dtypes):
        assert output.dtype == dtype
        assert output.tolist() == _expected(sizes, stride, zero, 32 if dtype == torch.int32 else 64), (stride, zero)


def test_an_int32_output_keeps_the_low_32_bits_of_a_large_offset():
    _, (out,) = splits_to_offsets_multi(torch.tensor([300000, 100000]), "cpu", strides=[7168],
                                        include_leading_zero=[False], dtypes=[torch.int32])
    assert out.tolist() == _expected([300000, 100000], 7168, False, 32) and out[0].item() < 0


def test_single_output_form_is_the_leading_zero_int64_scan():
    assert splits_to_offsets(torch.tensor([3, 0, 2]), 16).tolist() == [0, 48, 48, 80]


@pytest.mark.parametrize("call, message", [
    (lambda: splits_to_offsets_multi([1, 2], "cpu", strides=[1], include_leading_zero=[True], dtypes=[torch.int64]),
     "must be a tensor"),
    (lambda: splits_to_offsets_multi(torch.tensor([1]), "cpu", strides=[1, 2], include_leading_zero=[True],
                                     dtypes=[torch.int64]), "matching lengths"),
    (lambda: splits_to_offsets_multi(torch.tensor([1.0]), "cpu", strides=[1], include_leading_zero=[True],
                                     dtypes=[torch.int64]), "int32 or int64"),
    (lambda: splits_to_offsets(torch.tensor([1], dtype=torch.int32), 4), "int64"),
    (lambda: splits_to_offsets(torch.tensor([1]), 0), "greater than 0"),
])
def test_what_the_kernel_refuses_raises_naming_it(call, message):
    with pytest.raises((RuntimeError, TypeError), match=message):
        call()
