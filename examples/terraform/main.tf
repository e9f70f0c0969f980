# Terraform state kept by a local `wasmstate serve` (the embedded default).
#
#   cargo run --release -- serve          # in the repository root
#   terraform init && terraform apply     # here
#
# Each distinct last path segment is its own state ("workspace"): use
# -backend-config="address=…/states/default/staging" (and the two lock
# addresses) to pick another one.
terraform {
  backend "http" {
    address        = "http://127.0.0.1:6061/states/default/default"
    lock_address   = "http://127.0.0.1:6061/states/default/default"
    unlock_address = "http://127.0.0.1:6061/states/default/default"
  }
}

variable "greeting" {
  type    = string
  default = "hello from wasmstate"
}

resource "terraform_data" "example" {
  input = var.greeting
}

output "greeting" {
  value = terraform_data.example.output
}
