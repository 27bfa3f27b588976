"""Times diffusers' FluxTransformer2DModel (bf16, eager) as the flux_block bench runs cleave's: FLUX.1 width
(hidden 3072, 24 heads of 128, T5 width 4096), DOUBLE double and SINGLE single blocks, random weights, over a
SIDE x SIDE grid of latent tokens (64: a 1024x1024 image) and TEXT text tokens (FluxPipeline's 512); the median
of N passes after two warm-up passes, each waited for. Prints one JSON line.
Usage: flux_peer.py [DOUBLE,SINGLE [N [SIDE [TEXT]]]]   (defaults 1,1 5 64 512; on the GPU, else the CPU)"""
import json, statistics, sys, time
import torch
from diffusers import FluxTransformer2DModel

args = sys.argv[1:] + ["1,1", "5", "64", "512"][len(sys.argv) - 1:]
double, single = (int(n) for n in args[0].split(","))
passes, side, text = (int(a) for a in args[1:4])
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device(device):
    model = FluxTransformer2DModel(num_layers=double, num_single_layers=single, guidance_embeds=True).eval()
    rows = torch.arange(side).repeat_interleave(side)
    inputs = dict(
        hidden_states=torch.randn(1, side * side, 64),
        encoder_hidden_states=torch.randn(1, text, 4096),
        pooled_projections=torch.randn(1, 768),
        timestep=torch.tensor([1.0]),
        img_ids=torch.stack([torch.zeros_like(rows), rows, torch.arange(side).repeat(side)], 1).to(torch.bfloat16),
        txt_ids=torch.zeros(text, 3),
        guidance=torch.tensor([3.5]),
        return_dict=False,
    )


def seconds():
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        model(**inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


seconds(), seconds()
median = statistics.median(seconds() for _ in range(passes))
print(json.dumps({"peer": "diffusers eager bf16", "device": torch.cuda.get_device_name() if device == "cuda" else device,
                  "double_blocks": double, "single_blocks": single, "image_tokens": side * side, "text_tokens": text,
                  "pass_ms": round(median * 1e3, 2)}))
