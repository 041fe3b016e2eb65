"""The reference trainer (`slime-train`): plain torch + transformers on CPU, slime's loop and losses."""
