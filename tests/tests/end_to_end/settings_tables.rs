//! Every settings table in the services' READMEs names keys the services read: each row's
//! environment variable is its key's, and the key, set to its documented default, loads.

use test_support::assert_documented_settings_are_read;

#[test]
fn the_gateway_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<gateway::Settings>(
        include_str!("../../../services/gateway/README.md"),
        "GATEWAY",
    );
}

#[test]
fn orders_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<orders::Settings>(
        include_str!("../../../services/orders/README.md"),
        "ORDERS",
    );
}

#[test]
fn payment_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<payment::Settings>(
        include_str!("../../../services/payment/README.md"),
        "PAYMENT",
    );
}

#[test]
fn bank_mock_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<bank_mock::Settings>(
        include_str!("../../../services/bank-mock/README.md"),
        "BANK",
    );
}

#[test]
fn the_webhook_sender_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<webhook_sender::Settings>(
        include_str!("../../../services/webhook-sender/README.md"),
        "WEBHOOK_SENDER",
    );
}

#[test]
fn the_stack_reads_every_setting_its_readme_documents() {
    assert_documented_settings_are_read::<stack::chain::ChainSettings>(
        include_str!("../../../services/stack/README.md"),
        "STACK",
    );
}
