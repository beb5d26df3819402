"""SGLang's frontend language (`import sglang as sgl`), interpreted against an SGLang server."""
