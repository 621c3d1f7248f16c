-- The configuration under test: the setup of docs/editors.md, with the estc binary and
-- the checkout's editors/nvim from the environment (editors/nvim/test.sh sets them).
vim.opt.runtimepath:append(vim.env.EST_NVIM_DIR)
require("est").setup({ cmd = { vim.env.ESTC, "lsp" }, target = "host" })
